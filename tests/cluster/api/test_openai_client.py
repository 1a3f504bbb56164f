"""The official `openai` Python client, unchanged, against the router's HTTP API on 127.0.0.1."""

from collections.abc import AsyncIterator

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from radixmesh.cluster.api.app import start_http
from radixmesh.common.text.chat_template import ChatMessage, PlainChatTemplate
from radixmesh.common.text.tokenizer import ByteTokenizer
from radixmesh.proto.serve.sampling import SamplingParams
from tests.support.router_cluster import MODEL_NAME, local_cluster, reference

pytestmark = [pytest.mark.anyio, pytest.mark.integration]
TOK = ByteTokenizer()
SYSTEM = "You are a terse assistant that answers in one line."


@pytest.fixture
async def client() -> AsyncIterator[openai.AsyncOpenAI]:
    async with local_cluster(2) as cluster:
        runner, port = await start_http(cluster.router, "127.0.0.1", 0)
        try:
            async with openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused",
                                          max_retries=0) as c:
                yield c
        finally:
            await runner.cleanup()


def greedy(text: str, max_tokens: int) -> str:
    return TOK.decode(list(reference(TOK.encode(text), SamplingParams(max_tokens=max_tokens))))


async def test_completions(client: openai.AsyncOpenAI) -> None:
    prompt = "Once upon a time, in a cluster far away,"
    first = await client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=6, temperature=0)
    assert first.choices[0].text == greedy(prompt, 6)
    assert first.usage is not None and first.usage.prompt_tokens == len(prompt)
    again = await client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=6, temperature=0)
    assert again.usage is not None and again.usage.prompt_tokens_details is not None
    # Every full block but the one holding the last token (the engine computes that token itself).
    assert again.usage.prompt_tokens_details.cached_tokens == ((len(prompt) - 1) // 4) * 4


async def test_chat_multi_turn_reuses_the_history(client: openai.AsyncOpenAI) -> None:
    history: list[dict[str, str]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi!"}]
    first = await client.chat.completions.create(model=MODEL_NAME, messages=history, max_tokens=5,  # type: ignore[arg-type]
                                                 temperature=0)
    reply = first.choices[0].message.content
    assert first.choices[0].message.role == "assistant"
    rendered = PlainChatTemplate().render([ChatMessage(m["role"], m["content"]) for m in history])
    assert reply == greedy(rendered, 5)
    history += [{"role": "assistant", "content": reply or ""}, {"role": "user", "content": "And then?"}]
    second = await client.chat.completions.create(model=MODEL_NAME, messages=history, max_tokens=5,  # type: ignore[arg-type]
                                                  temperature=0)
    assert second.usage is not None and second.usage.prompt_tokens_details is not None
    # The first turn's prompt is a prefix of the second's: its full blocks are reused.
    assert (second.usage.prompt_tokens_details.cached_tokens or 0) >= (len(TOK.encode(rendered)) // 4) * 4


async def test_streaming_completions(client: openai.AsyncOpenAI) -> None:
    prompt = "Streaming tokens one by one:"
    stream = await client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=9, temperature=0,
                                             stream=True, stream_options={"include_usage": True})
    pieces, usage = [], None
    async for chunk in stream:
        pieces += [c.text for c in chunk.choices]
        usage = chunk.usage or usage
    assert "".join(pieces) == greedy(prompt, 9)
    expected = reference(TOK.encode(prompt), SamplingParams(max_tokens=9))
    assert usage is not None and (usage.prompt_tokens, usage.completion_tokens) == (len(prompt), len(expected))


async def test_streaming_chat(client: openai.AsyncOpenAI) -> None:
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say something."}]
    chat = await client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=8,
                                                temperature=0, stream=True)
    text, finish = "", None
    async for chunk in chat:
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    assert text == greedy(PlainChatTemplate().render([ChatMessage("user", "Say something.")]), 8)
    assert finish in ("length", "stop")


async def test_errors_surface_as_openai_exceptions(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        await client.completions.create(model=MODEL_NAME, prompt="x", max_tokens=4, temperature=5)
    assert bad.value.status_code == 400 and "temperature" in bad.value.message
    with pytest.raises(openai.NotFoundError):
        await client.completions.create(model="gpt-4", prompt="x", max_tokens=4)
    models = await client.models.list()
    assert [m.id for m in models.data] == [MODEL_NAME]


async def test_cache_salt_through_extra_body_and_user_shares(client: openai.AsyncOpenAI) -> None:
    prompt = "A long shared system prompt that many end users send."
    full = ((len(prompt) - 1) // 4) * 4

    async def cached(**kw: object) -> int:
        answer = await client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=2, temperature=0,
                                                 **kw)  # type: ignore[call-overload]
        assert answer.usage is not None and answer.usage.prompt_tokens_details is not None
        return answer.usage.prompt_tokens_details.cached_tokens or 0

    assert await cached(user="alice") == 0
    assert await cached(user="bob") == full  # `user` names the end user; it does not split the cache
    assert await cached(extra_body={"cache_salt": "tenant-a"}) == 0
    assert await cached(extra_body={"cache_salt": "tenant-a"}) == full


async def test_stop_and_default_max_tokens(client: openai.AsyncOpenAI) -> None:
    prompt = "Once upon a time, in a cluster far away,"
    ids = reference(TOK.encode(prompt), SamplingParams(max_tokens=16))
    text = TOK.decode(list(ids))
    start = next(i for i in range(1, len(text)) if text[i].isascii() and text[i].isprintable())
    answer = await client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=16, temperature=0,
                                             stop=[text[start]])
    assert answer.choices[0].text == text[: text.index(text[start])]
    assert answer.choices[0].finish_reason == "stop"
    chat = await client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "y" * 980}],
                                                temperature=0, extra_body={"ignore_eos": True})
    assert chat.usage is not None and chat.usage.total_tokens == 1024  # the tiny model's whole context


async def test_unknown_fields_are_refused_by_name(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        await client.completions.create(model=MODEL_NAME, prompt="x", max_tokens=2, extra_body={"max_token": 4})
    assert "max_token" in bad.value.message
    with pytest.raises(openai.BadRequestError) as unsupported:
        await client.completions.create(model=MODEL_NAME, prompt="x", max_tokens=2, best_of=2)
    assert "'best_of'" in unsupported.value.message
