"""Log-probabilities (OpenAI's `logprobs` / `top_logprobs`): the engine's, from the logits it
samples from, equal a reference log-softmax on the tiny random model, cached prefix or not; the
router's HTTP API returns them whole and streamed in OpenAI's two shapes; bad values are 400s."""

import json
import math
from collections.abc import AsyncIterator, Sequence

import pytest
import torch

from radixmesh.node_agent.engine.config import EngineConfig
from radixmesh.node_agent.engine.engine import Engine
from radixmesh.node_agent.engine.request import Request, RequestId, RequestOutput
from radixmesh.node_agent.memory.config import MemoryConfig
from radixmesh.proto.serve.sampling import SamplingParams, TokenLogprob
from tests.support.router_cluster import BS, MODEL_NAME, SOURCE
from tests.support.router_http import TOK, Api, serving_api

PROMPT = "Log-probabilities come from the very logits each token was sampled from."
TOL = 1e-4


def engine(caching: bool) -> Engine:
    memory = MemoryConfig(num_gpu_blocks=256, enable_prefix_caching=caching)
    return Engine(SOURCE.load(), EngineConfig(block_size=BS, keep_logits=True, model_id=SOURCE.identity(),
                                              memory=memory))


def reference(prompt: Sequence[int], sampling: SamplingParams) -> RequestOutput:
    """One cache-less engine: its tokens and the logits of every generated position."""
    return engine(caching=False).generate([Request(RequestId("ref"), tuple(prompt), sampling)])[0]


def close(a: object, b: object) -> bool:
    """Equal JSON, floats within TOL (a second request may reuse cached KV: its logits differ in the
    last float32 bits)."""
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) < TOL
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(close(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def assert_matches(got: Sequence[TokenLogprob], ref: RequestOutput, top: int) -> None:
    assert ref.logits is not None and len(got) == len(ref.output_token_ids)
    for entry, token, logits in zip(got, ref.output_token_ids, ref.logits, strict=True):
        want = torch.log_softmax(logits.double(), dim=-1)
        assert entry.token_id == token and abs(entry.logprob - float(want[token])) < TOL
        best = torch.topk(want, top)
        assert [i for i, _ in entry.top] == best.indices.tolist()
        assert all(abs(lp - w) < TOL for (_, lp), w in zip(entry.top, best.values.tolist(), strict=True))


@pytest.mark.parametrize("top", [0, 5])
def test_engine_logprobs_equal_a_reference_log_softmax_with_a_cached_prefix(top: int) -> None:
    tokens = TOK.encode(PROMPT)
    sampling = SamplingParams(max_tokens=6, temperature=0.8, seed=3, ignore_eos=True, logprobs=top)
    eng = engine(caching=True)
    [warm] = eng.generate([Request(RequestId("warm"), tuple(tokens), sampling)])
    [cached] = eng.generate([Request(RequestId("again"), tuple(tokens), sampling)])
    assert cached.stats.sources is not None and cached.stats.sources.local_gpu > 0
    ref = reference(tokens, sampling)
    for out in (warm, cached):
        assert out.output_token_ids == ref.output_token_ids
        assert_matches(out.logprobs, ref, top)
        assert all(len(e.top) == top for e in out.logprobs)
    # The very logits the engine sampled from: exact, not merely close.
    assert warm.logits is not None
    assert [e.logprob for e in warm.logprobs] == [
        float(torch.log_softmax(lg, dim=-1)[t]) for lg, t in zip(warm.logits, warm.output_token_ids, strict=True)]


def test_without_logprobs_none_are_computed_and_bad_counts_are_refused() -> None:
    [out] = engine(caching=False).generate([Request(RequestId("r"), (1, 2, 3), SamplingParams(max_tokens=3))])
    assert out.logprobs == ()
    for bad in (-1, 21):
        with pytest.raises(ValueError, match="logprobs must be in"):
            SamplingParams(logprobs=bad)


@pytest.fixture
async def api() -> AsyncIterator[Api]:
    async with serving_api() as served:
        yield served


def ref_entries(prompt: Sequence[int], top: int, max_tokens: int = 5) -> tuple[RequestOutput, list[TokenLogprob]]:
    sampling = SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=9, ignore_eos=True, logprobs=top)
    ref = reference(prompt, sampling)
    return ref, list(ref.logprobs)


@pytest.mark.anyio
@pytest.mark.integration
async def test_completion_logprobs_whole_and_streamed(api: Api) -> None:
    ref, entries = ref_entries(TOK.encode(PROMPT), 3)
    body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 5, "temperature": 1.0, "seed": 9,
            "ignore_eos": True, "logprobs": 3}
    status, whole = await api.post("/v1/completions", body)
    assert status == 200, whole
    lp = whole["choices"][0]["logprobs"]
    assert lp["tokens"] == [TOK.decode([t]) for t in ref.output_token_ids]
    assert all(abs(g - e.logprob) < TOL for g, e in zip(lp["token_logprobs"], entries, strict=True))
    # Bytes >= 0x80 alone all decode to U+FFFD: one key, the likeliest's (OpenAI's shape is a dict).
    assert [list(d) for d in lp["top_logprobs"]] == [list(dict.fromkeys(TOK.decode([i]) for i, _ in e.top))
                                                     for e in entries]
    assert lp["text_offset"] == [sum(len(t) for t in lp["tokens"][:i]) for i in range(5)]
    assert all(v <= 0 for d in lp["top_logprobs"] for v in d.values())
    # Streamed: the chunks' lists, joined, are the whole answer's.
    events = await api.sse("/v1/completions", {**body, "stream": True})
    streamed: dict[str, list[object]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for e in events[:-1]:
        [choice] = json.loads(e)["choices"]
        for key, values in (choice["logprobs"] or {}).items():
            streamed[key].extend(values)
    assert close(streamed, lp), (streamed, lp)


@pytest.mark.anyio
@pytest.mark.integration
async def test_chat_logprobs_with_top_logprobs_whole_and_streamed(api: Api) -> None:
    messages = [{"role": "user", "content": PROMPT}]
    body = {"model": MODEL_NAME, "messages": messages, "max_tokens": 4, "temperature": 1.0, "seed": 9,
            "ignore_eos": True, "logprobs": True, "top_logprobs": 2}
    status, whole = await api.post("/v1/chat/completions", body)
    assert status == 200, whole
    content = whole["choices"][0]["logprobs"]["content"]
    assert len(content) == 4 and all(len(c["top_logprobs"]) == 2 for c in content)
    assert all(c["top_logprobs"][0]["logprob"] >= c["logprob"] - TOL for c in content)  # the best comes first
    assert all(c["bytes"] == list(c["token"].encode()) and math.isfinite(c["logprob"]) for c in content)
    events = await api.sse("/v1/chat/completions", {**body, "stream": True})
    streamed = [c for e in events[:-1] for choice in json.loads(e)["choices"]
                for c in (choice["logprobs"] or {"content": []})["content"]]
    assert close(streamed, content), (streamed, content)
    # logprobs false: none, and no alternatives either
    status, off = await api.post("/v1/chat/completions", {**body, "logprobs": False, "top_logprobs": None})
    assert status == 200 and off["choices"][0]["logprobs"] is None


@pytest.mark.anyio
@pytest.mark.integration
@pytest.mark.parametrize(("path", "extra", "param"), [
    ("/v1/completions", {"logprobs": 21}, "logprobs"),
    ("/v1/completions", {"logprobs": -1}, "logprobs"),
    ("/v1/completions", {"logprobs": True}, "logprobs"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {"logprobs": 3}, "logprobs"),
])
async def test_bad_logprobs_are_400_and_change_nothing(api: Api, path: str, extra: dict[str, object],
                                                       param: str) -> None:
    prompt = {"prompt": PROMPT} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "x"}]}
    status, error = await api.post(path, {"model": MODEL_NAME, **prompt, **extra})
    assert status == 400 and error["error"]["param"] == param, error
    assert api.cluster.router.metrics.total.requests == 0
