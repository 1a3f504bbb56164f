"""vLLM's request surface of the router's HTTP API: default max_tokens, stop strings and ids,
cache_salt, the field policy, tokenizer endpoints, version, router histograms."""

import importlib.metadata
import json
from typing import Any

import pytest

from radixmesh.common.text.chat_template import ChatMessage, PlainChatTemplate
from radixmesh.proto.events import Tier
from radixmesh.proto.serve.sampling import SamplingParams
from tests.support.router_cluster import MODEL_NAME, reference
from tests.support.router_http import PROMPT, TOK, Api, api, greedy

pytestmark = [pytest.mark.anyio, pytest.mark.integration]
__all__ = ["api"]  # the fixture


# --- vLLM's request surface: default max_tokens, stop strings and ids, cache_salt, the field policy ---
def cached(answer: dict[str, Any]) -> int:
    return int(answer["usage"]["prompt_tokens_details"]["cached_tokens"])


async def test_omitted_max_tokens_generates_to_the_end_of_the_context(api: Api) -> None:
    limit = api.cluster.router.config.limits.max_context_tokens  # the tiny model's 1024 positions
    prompt = (PROMPT * 20)[: limit - 6]
    body = {"model": MODEL_NAME, "prompt": prompt, "temperature": 0, "ignore_eos": True}
    status, answer = await api.post("/v1/completions", body)
    assert status == 200 and answer["choices"][0]["finish_reason"] == "length"
    assert answer["usage"]["completion_tokens"] == 6
    status, too_long = await api.post("/v1/completions", {**body, "max_tokens": 7})
    assert status == 400 and "context limit" in too_long["error"]["message"]


async def test_omitted_max_completion_tokens_in_chat_fills_the_context(api: Api) -> None:
    limit = api.cluster.router.config.limits.max_context_tokens
    rendered = PlainChatTemplate().render([ChatMessage("user", "")])
    content = "y" * (limit - len(TOK.encode(rendered)) - 3)
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": content}], "temperature": 0,
            "ignore_eos": True}
    status, answer = await api.post("/v1/chat/completions", body)
    assert status == 200 and answer["usage"]["completion_tokens"] == 3
    assert answer["usage"]["prompt_tokens"] + 3 == limit


def stop_case(max_tokens: int = 16) -> tuple[str, str, int]:
    """A stop string taken from the reference reply itself, the reply cut before it, and the tokens
    generated up to the one that completes it."""
    ids = reference(TOK.encode(PROMPT), SamplingParams(max_tokens=max_tokens, seed=1))
    text = TOK.decode(list(ids))
    start = next(i for i in range(1, len(text) - 1) if text[i:i + 2].isascii() and text[i:i + 2].isprintable())
    stop = text[start:start + 2]
    upto = next(n for n in range(1, len(ids) + 1) if stop in TOK.decode(list(ids[:n])))
    return stop, text[: text.index(stop)], upto


async def test_stop_string_cuts_the_reply_before_it(api: Api) -> None:
    stop, expected, upto = stop_case()
    body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 16, "temperature": 0, "stop": ["zzz", stop]}
    status, answer = await api.post("/v1/completions", body)
    assert status == 200
    assert (answer["choices"][0]["text"], answer["choices"][0]["finish_reason"]) == (expected, "stop")
    assert answer["usage"]["completion_tokens"] == upto
    # The engine ended the request at the stop (not the router aborting it): no token was generated
    # past it, the agent measured the prompt's cache hits, and the request counts as served.
    assert sum(a.engine.counters.generated_tokens for a in api.cluster.agents) == upto
    assert cached(answer) >= 0
    assert api.cluster.router.metrics.status_counts == {"ok": 1}
    for a in api.cluster.agents:
        await a.check_invariants()
        assert a.memory.block_counts(Tier.GPU).in_use == 0


async def test_stop_string_in_a_stream(api: Api) -> None:
    stop, expected, upto = stop_case()
    body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 16, "temperature": 0, "stop": stop,
            "stream": True, "stream_options": {"include_usage": True}}
    events = await api.sse("/v1/completions", body)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == expected
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["usage"]["completion_tokens"] == upto


async def test_stop_token_ids_end_the_reply_after_the_token(api: Api) -> None:
    ids = reference(TOK.encode(PROMPT), SamplingParams(max_tokens=16, seed=1))
    stop_id = ids[4]
    upto = ids.index(stop_id) + 1
    body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 16, "temperature": 0, "stop_token_ids": [stop_id]}
    status, answer = await api.post("/v1/completions", body)
    assert status == 200 and answer["choices"][0]["finish_reason"] == "stop"
    assert answer["usage"]["completion_tokens"] == upto
    assert answer["choices"][0]["text"] == TOK.decode(list(ids[:upto]))


async def test_cache_salt_isolates_tenants(api: Api) -> None:
    body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 2, "temperature": 0}
    full = ((len(TOK.encode(PROMPT)) - 1) // 4) * 4
    _, first = await api.post("/v1/completions", {**body, "cache_salt": "acme"})
    _, other = await api.post("/v1/completions", {**body, "cache_salt": "globex"})
    _, shared = await api.post("/v1/completions", body)
    assert cached(first) == cached(other) == cached(shared) == 0  # three tenants share nothing
    _, same = await api.post("/v1/completions", {**body, "cache_salt": "acme"})
    _, shared_again = await api.post("/v1/completions", body)
    assert cached(same) == cached(shared_again) == full


async def test_user_does_not_split_the_cache(api: Api) -> None:
    body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 2, "temperature": 0}
    _, alice = await api.post("/v1/completions", {**body, "user": "alice"})
    _, bob = await api.post("/v1/completions", {**body, "user": "bob"})
    assert cached(alice) == 0 and cached(bob) == ((len(TOK.encode(PROMPT)) - 1) // 4) * 4


async def test_accepted_and_neutral_fields_are_served(api: Api) -> None:
    body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 3, "temperature": 0, "user": "u",
            "metadata": {"k": "v"}, "store": False, "n": 1, "logprobs": None, "echo": False, "stop": None,
            "presence_penalty": 0, "stream": False}
    status, answer = await api.post("/v1/completions", body)
    assert status == 200 and answer["choices"][0]["text"] == greedy(PROMPT, 3)
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello", "refusal": None,
                                                    "tool_calls": None}, {"role": "user", "content": "More"}]
    status, _ = await api.post("/v1/chat/completions", {"model": MODEL_NAME, "messages": messages, "max_tokens": 2,
                                                        "response_format": {"type": "text"}, "tool_choice": "none"})
    assert status == 200


# --- what vLLM users call besides completions ---------------------------------------------------
async def test_model_card_tokenize_detokenize_health_and_version(api: Api) -> None:
    status, card = await api.get(f"/v1/models/{MODEL_NAME}")
    assert status == 200 and json.loads(card)["id"] == MODEL_NAME
    status, missing = await api.get("/v1/models/gpt-5")
    assert status == 404 and json.loads(missing)["error"]["code"] == "model_not_found"
    status, tokens = await api.post("/tokenize", {"prompt": PROMPT})
    assert status == 200 and tokens["tokens"] == TOK.encode(PROMPT) and tokens["count"] == len(tokens["tokens"])
    status, chat = await api.post("/tokenize", {"messages": [{"role": "user", "content": "hi"}]})
    rendered = PlainChatTemplate().render([ChatMessage("user", "hi")])
    assert status == 200 and chat["tokens"] == TOK.encode(rendered)
    status, text = await api.post("/detokenize", {"tokens": tokens["tokens"]})
    assert status == 200 and text["prompt"] == PROMPT
    for path, body in (("/tokenize", {"prompt": "x", "add_special_tokens": True}), ("/tokenize", {"prompt": 3}),
                       ("/detokenize", {"tokens": [10**9]}), ("/detokenize", {"tokens": "abc"})):
        status, error = await api.post(path, body)
        assert status == 400 and error["error"]["message"], (path, body)
    assert (await api.get("/health")) == (200, "")
    status, version = await api.get("/version")
    assert status == 200 and json.loads(version)["version"] == importlib.metadata.version("radixmesh")


async def test_router_histograms_count_every_gap_request_and_wait(api: Api) -> None:
    body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 12, "ignore_eos": True, "stream": True}
    await api.sse("/v1/completions", body)
    m = api.cluster.router.metrics
    assert (m.e2e.snapshot().count, m.queue.snapshot().count, m.inter_token.snapshot().count) == (1, 1, 11)
