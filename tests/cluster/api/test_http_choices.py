"""OpenAI's `n` on the router's HTTP API: n choices of one prompt, each sampled with seed + i, all
served by the node of the first, whose cached prefix the others reuse (real agents, metadata
service and cost policy on 127.0.0.1)."""

import asyncio
import json
from collections import defaultdict
from collections.abc import AsyncGenerator, AsyncIterator

import pytest

from radixmesh.cluster.api.choices import merge_choices
from radixmesh.proto.serve.limits import usable_prefix_blocks
from radixmesh.proto.serve.sampling import SamplingParams
from tests.support.router_cluster import BS, MODEL_NAME, Cluster, reference
from tests.support.router_http import TOK, Api, serving_api

pytestmark = [pytest.mark.anyio, pytest.mark.integration]
PROMPT = "Several answers to one question share the question's KV: it is prefilled once."


@pytest.fixture
async def api() -> AsyncIterator[Api]:
    async with serving_api(3, publish=True) as served:
        yield served


def sampled(seed: int, max_tokens: int = 6) -> str:
    params = SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=seed, ignore_eos=True)
    return TOK.decode(list(reference(TOK.encode(PROMPT), params)))


def served_by(cluster: Cluster) -> dict[str, int]:
    return {node: table.requests for node, table in cluster.router.metrics.per_node.items() if table.requests}


async def test_n_choices_use_seed_plus_i_on_one_node_and_reuse_its_prefix(api: Api) -> None:
    body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 6, "temperature": 1.0, "seed": 5, "n": 3,
            "ignore_eos": True}
    status, answer = await api.post("/v1/completions", body)
    assert status == 200, answer
    assert [c["index"] for c in answer["choices"]] == [0, 1, 2]
    assert [c["text"] for c in answer["choices"]] == [sampled(5), sampled(6), sampled(7)]
    prompt_tokens = len(TOK.encode(PROMPT))
    assert answer["usage"]["prompt_tokens"] == prompt_tokens and answer["usage"]["completion_tokens"] == 18
    [(node, requests)] = served_by(api.cluster).items()
    assert requests == 3
    # Choice 0 computed the prompt; choices 1 and 2 found every reusable block in node's cache.
    reusable = usable_prefix_blocks(prompt_tokens, BS) * BS
    tokens = api.cluster.router.metrics.per_node[node].tokens
    assert (tokens.local_gpu, tokens.computed) == (2 * reusable, 3 * prompt_tokens - 2 * reusable)


async def test_streamed_choices_carry_their_index_and_equal_the_whole_answer(api: Api) -> None:
    messages = [{"role": "user", "content": PROMPT}]
    body = {"model": MODEL_NAME, "messages": messages, "max_tokens": 5, "temperature": 1.0, "seed": 11, "n": 2,
            "ignore_eos": True}
    status, whole = await api.post("/v1/chat/completions", body)
    assert status == 200, whole
    events = await api.sse("/v1/chat/completions", {**body, "stream": True,
                                                      "stream_options": {"include_usage": True}})
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text: dict[int, str] = defaultdict(str)
    finished: list[int] = []
    for chunk in chunks[:-1]:
        [choice] = chunk["choices"]
        text[choice["index"]] += choice["delta"].get("content", "")
        if choice["finish_reason"] is not None:
            finished.append(choice["index"])
    assert sorted(finished) == [0, 1]
    assert [text[i] for i in (0, 1)] == [c["message"]["content"] for c in whole["choices"]]
    usage = chunks[-1]["usage"]
    assert chunks[-1]["choices"] == [] and usage["completion_tokens"] == whole["usage"]["completion_tokens"] == 10
    # The streamed request came second: its first choice found the whole answer's prompt cached.
    assert usage["prompt_tokens_details"]["cached_tokens"] > whole["usage"]["prompt_tokens_details"]["cached_tokens"]


async def test_bad_n_changes_nothing(api: Api) -> None:
    for n in (0, 17, 2.5, True):
        status, error = await api.post("/v1/completions", {"model": MODEL_NAME, "prompt": PROMPT, "n": n})
        assert status == 400 and error["error"]["param"] == "n", (n, error)
    assert served_by(api.cluster) == {}
    assert api.cluster.router.metrics.total.requests == 0


async def test_a_failing_choice_surfaces_and_closes_every_other() -> None:
    closed: list[str] = []

    async def stream(name: str, items: list[str], fail: bool = False) -> AsyncGenerator[str, None]:
        try:
            for item in items:
                yield item
            if fail:
                raise ValueError(f"{name} failed")
            await asyncio.Event().wait()  # a choice still streaming when another fails
        finally:
            closed.append(name)

    started: list[str] = []

    def rest() -> list[AsyncGenerator[str, None]]:
        started.append("rest")  # only once the first choice produced its first item
        return [stream("b", ["b0"], fail=True)]

    merged = merge_choices(stream("a", ["a0", "a1"]), rest)
    assert await anext(merged) == (0, "a0") and started == []
    seen = []
    with pytest.raises(ValueError, match="b failed"):
        async for item in merged:
            seen.append(item)
    assert started == ["rest"] and (1, "b0") in seen
    assert sorted(closed) == ["a", "b"]
