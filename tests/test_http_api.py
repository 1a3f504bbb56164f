"""The router's HTTP API on 127.0.0.1: OpenAI shapes, SSE streaming, errors that change nothing,
/stats, /metrics, /healthz, /v1/models."""

import importlib.metadata
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from router_cluster import MODEL_NAME, Cluster, local_cluster, reference

from radixmesh.cluster.router.http_api import start_http
from radixmesh.node_agent.model.chat_template import ChatMessage, PlainChatTemplate
from radixmesh.node_agent.model.tokenizer import ByteTokenizer
from radixmesh.proto.serve.sampling import SamplingParams

pytestmark = [pytest.mark.anyio, pytest.mark.integration]
TOK = ByteTokenizer()
PROMPT = "The quick brown fox jumps over the lazy dog, again and again."


class Api:
    def __init__(self, cluster: Cluster, session: aiohttp.ClientSession, base: str) -> None:
        self.cluster, self.session, self.base = cluster, session, base

    async def post(self, path: str, body: object) -> tuple[int, Any]:
        data = body if isinstance(body, str) else json.dumps(body)
        async with self.session.post(self.base + path, data=data) as resp:
            return resp.status, await resp.json()

    async def get(self, path: str) -> tuple[int, str]:
        async with self.session.get(self.base + path) as resp:
            return resp.status, await resp.text()

    async def sse(self, path: str, body: dict[str, Any]) -> list[str]:
        """The `data:` payloads of a streamed answer, in order."""
        async with self.session.post(self.base + path, json=body) as resp:
            assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
            raw = (await resp.read()).decode()
        events = [e for e in raw.split("\n\n") if e]
        assert all(e.startswith("data: ") for e in events)
        return [e[len("data: "):] for e in events]


@pytest.fixture
async def api() -> AsyncIterator[Api]:
    async with local_cluster(2) as cluster:
        runner, port = await start_http(cluster.router, "127.0.0.1", 0)
        try:
            async with aiohttp.ClientSession() as session:
                yield Api(cluster, session, f"http://127.0.0.1:{port}")
        finally:
            await runner.cleanup()


def greedy(text: str, max_tokens: int) -> str:
    return TOK.decode(list(reference(TOK.encode(text), SamplingParams(max_tokens=max_tokens, seed=1))))


async def test_completion_text_usage_and_cached_tokens(api: Api) -> None:
    body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "seed": 1}
    status, first = await api.post("/v1/completions", body)
    assert status == 200 and first["object"] == "text_completion"
    assert first["choices"][0]["text"] == greedy(PROMPT, 8)
    assert first["choices"][0]["finish_reason"] in ("length", "stop")
    n = len(TOK.encode(PROMPT))
    usage = first["usage"]
    assert usage["prompt_tokens"] == n and usage["prompt_tokens_details"]["cached_tokens"] == 0
    assert usage["total_tokens"] == n + usage["completion_tokens"]
    _, again = await api.post("/v1/completions", body)
    # Same prompt again: the pending holder routes it to the node that has its full blocks.
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == (n // 4) * 4
    assert again["choices"][0]["text"] == first["choices"][0]["text"]


async def test_token_id_prompt_equals_text_prompt(api: Api) -> None:
    ids = TOK.encode(PROMPT)
    _, by_text = await api.post("/v1/completions", {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 5,
                                                    "temperature": 0})
    _, by_ids = await api.post("/v1/completions", {"model": MODEL_NAME, "prompt": [ids], "max_tokens": 5,
                                                   "temperature": 0})
    assert by_ids["choices"][0]["text"] == by_text["choices"][0]["text"]


async def test_streamed_completion_concatenates_to_the_whole_answer(api: Api) -> None:
    body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 12, "temperature": 0.7, "seed": 5}
    _, whole = await api.post("/v1/completions", body)
    events = await api.sse("/v1/completions", {**body, "stream": True, "stream_options": {"include_usage": True}})
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "text_completion" and c["id"] == chunks[0]["id"] for c in chunks)
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert text == whole["choices"][0]["text"]
    assert chunks[-2]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 12


async def test_chat_and_streamed_chat(api: Api) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
    body = {"model": MODEL_NAME, "messages": messages, "max_tokens": 7, "temperature": 0}
    status, whole = await api.post("/v1/chat/completions", body)
    assert status == 200 and whole["object"] == "chat.completion"
    rendered = PlainChatTemplate().render([ChatMessage(m["role"], m["content"]) for m in messages])
    assert whole["choices"][0]["message"] == {"role": "assistant", "content": greedy(rendered, 7)}
    assert whole["usage"]["prompt_tokens"] == len(TOK.encode(rendered))
    events = await api.sse("/v1/chat/completions", {**body, "stream": True})
    chunks = [json.loads(e) for e in events[:-1]]
    assert events[-1] == "[DONE]" and all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == greedy(rendered, 7)
    assert chunks[-1]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]


BAD: list[tuple[str, object, int, str | None]] = [
    ("/v1/completions", "{not json", 400, None),
    ("/v1/completions", [1, 2], 400, None),
    ("/v1/completions", {"prompt": "x"}, 400, "model"),
    ("/v1/completions", {"model": "other", "prompt": "x"}, 404, "model"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": ""}, 400, "prompt"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": ["a", "b"]}, 400, "prompt"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": [1, 9999]}, 400, "prompt"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": "x", "max_tokens": 5000}, 400, "prompt"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": "x", "max_tokens": True}, 400, "max_tokens"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": "x", "temperature": 3}, 400, "temperature"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": "x", "top_p": 0}, 400, "top_p"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": "x", "n": 2}, 400, "n"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": "x", "stop": 5}, 400, "stop"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": "x", "stop_token_ids": [9999]}, 400, "stop_token_ids"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": "x", "stop_token_ids": 3}, 400, "stop_token_ids"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": "x", "ignore_eos": "yes"}, 400, "ignore_eos"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": "x", "cache_salt": 5}, 400, "cache_salt"),
    # The field policy: unknown names (typos) and unimplemented OpenAI/vLLM options are refused by name.
    ("/v1/completions", {"model": MODEL_NAME, "prompt": "x", "max_token": 5}, 400, "max_token"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": "x", "messages": []}, 400, "messages"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": "x", "logprobs": 2}, 400, "logprobs"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": "x", "echo": True}, 400, "echo"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": "x", "top_k": 5}, 400, "top_k"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": "x", "metadata": "m"}, 400, "metadata"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": "x", "stream": True,
                         "stream_options": {"include_usage": True, "continuous_usage_stats": True}}, 400,
     "stream_options.continuous_usage_stats"),
    ("/v1/chat/completions", {"model": MODEL_NAME, "messages": [{"role": "user", "content": "x"}],
                              "response_format": {"type": "json_object"}}, 400, "response_format"),
    ("/v1/chat/completions", {"model": MODEL_NAME, "messages": [{"role": "user", "content": "x"}],
                              "tools": [{"type": "function"}]}, 400, "tools"),
    ("/v1/chat/completions", {"model": MODEL_NAME, "messages": [{"role": "user", "content": "x"}],
                              "prompt": "x"}, 400, "prompt"),
    ("/v1/chat/completions", {"model": MODEL_NAME, "messages": [{"role": "user", "content": "x", "name": "a"}]},
     400, "messages[0].name"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": "x", "seed": -1}, 400, "seed"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": "x", "stream": "yes"}, 400, "stream"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": "x", "stream_options": {}}, 400, "stream_options"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": "x", "user": 5}, 400, "user"),
    ("/v1/chat/completions", {"model": MODEL_NAME, "messages": []}, 400, "messages"),
    ("/v1/chat/completions", {"model": MODEL_NAME, "messages": [{"role": "tool", "content": "x"}]}, 400,
     "messages[0].role"),
    ("/v1/chat/completions", {"model": MODEL_NAME, "messages": [{"role": "user", "content": 5}]}, 400,
     "messages[0].content"),
]


@pytest.mark.parametrize("path, body, status, param", BAD)
async def test_bad_requests_get_openai_errors_and_change_nothing(api: Api, path: str, body: object, status: int,
                                                                 param: str | None) -> None:
    got, answer = await api.post(path, body)
    assert got == status
    assert set(answer["error"]) == {"message", "type", "param", "code"} and answer["error"]["param"] == param
    assert answer["error"]["type"] == "invalid_request_error" and answer["error"]["message"]
    router = api.cluster.router
    assert router.metrics.routed == {} and router.metrics.total.requests == 0
    assert all(router.inflight(a.node) == 0 for a in api.cluster.agents)
    for a in api.cluster.agents:
        await a.check_invariants()
        assert a.engine.memory.gpu.pool.num_in_use == 0


async def test_unknown_route_and_method_answer_json_errors(api: Api) -> None:
    async with api.session.get(api.base + "/v1/nothing") as resp:
        assert resp.status == 404 and (await resp.json())["error"]["code"] == "404"
    async with api.session.get(api.base + "/v1/completions") as resp:
        assert resp.status == 405 and "error" in await resp.json()


async def test_models_and_healthz(api: Api) -> None:
    _, models = await api.get("/v1/models")
    assert [m["id"] for m in json.loads(models)["data"]] == [MODEL_NAME]
    status, health = await api.get("/healthz")
    assert status == 200 and json.loads(health)["nodes"] == 2


async def test_stats_totals_equal_the_sum_of_served_usage(api: Api) -> None:
    prompts = [PROMPT, PROMPT + " More.", "Something else entirely, long enough."]
    usages = []
    for p in prompts:
        _, answer = await api.post("/v1/completions", {"model": MODEL_NAME, "prompt": p, "max_tokens": 3})
        usages.append(answer["usage"])
    _, text = await api.get("/stats")
    stats = json.loads(text)
    router = stats["router"]
    assert router["requests"] == 3 and router["requests_by_status"] == {"ok": 3}
    assert router["prompt_tokens"] == sum(u["prompt_tokens"] for u in usages)
    cached = sum(u["prompt_tokens_details"]["cached_tokens"] for u in usages)
    assert router["local_gpu"] + router["local_host"] + router["remote"] == cached
    assert router["computed"] == router["prompt_tokens"] - cached
    assert sum(n["requests"] for n in router["nodes"].values()) == 3
    assert router["policy"] == router["active_policy"] == "cost" and not router["degraded"]
    assert stats["metadata"]["live_nodes"] == 0 and "source" in stats["metadata"]


async def test_metrics_scrape_merges_router_and_agents(api: Api) -> None:
    await api.post("/v1/completions", {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 2})
    status, text = await api.get("/metrics")
    assert status == 200
    helps = [line.split()[2] for line in text.splitlines() if line.startswith("# HELP")]
    assert len(helps) == len(set(helps))
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["radixmesh_router_requests"].samples[0].labels == {"model_name": MODEL_NAME, "status": "ok"}
    nodes = {s.labels.get("node") for f in families.values() for s in f.samples}
    assert {"a", "b"} <= nodes


async def test_outage_shows_in_stats_and_healthz(api: Api) -> None:
    await api.cluster.servers[-1].stop(0)
    status, _ = await api.post("/v1/completions", {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 2})
    assert status == 200
    stats = json.loads((await api.get("/stats"))[1])
    assert stats["router"]["degraded"] and stats["router"]["active_policy"] == "least_loaded"
    assert stats["metadata"] is None
    assert json.loads((await api.get("/healthz"))[1])["metadata_available"] is False


async def test_no_live_agent_answers_503(api: Api) -> None:
    for a in api.cluster.agents:
        await a.stop()
    body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 2}
    status, answer = await api.post("/v1/completions", body)
    assert status == 503 and answer["error"]["type"] == "server_error"
    async with api.session.post(api.base + "/v1/completions", json={**body, "stream": True}) as resp:
        assert resp.status == 503


async def test_route_explains_the_request_it_served(api: Api) -> None:
    status, report = await api.post("/radixmesh/route", {"prompt": PROMPT, "max_tokens": 4, "cache_salt": "acme"})
    assert status == 200
    assert report["node"] in api.cluster.router.directory.nodes()
    assert report["policy"] == "cost" and report["attempts"] == 1
    tokens = report["stats"]["tokens"]
    assert sum(tokens.values()) == len(TOK.encode(PROMPT)) == tokens["computed"]  # a fresh tenant: all computed
    assert {c["node"] for c in report["candidates"]} == set(api.cluster.router.directory.nodes())


@pytest.mark.parametrize(("body", "param"), [
    ({"max_tokens": 4}, "prompt"),
    ({"prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "hi", "cache_salt": 7}, "cache_salt"),
    ({"prompt": "hi", "user": "acme"}, "user"),  # the OpenAI endpoints' field policy: unknown names are refused
    ({"prompt": "", "max_tokens": 4}, "prompt"),
])
async def test_route_refuses_bad_bodies_with_openai_errors(api: Api, body: dict[str, Any], param: str) -> None:
    status, error = await api.post("/radixmesh/route", body)
    assert status == 400 and error["error"]["param"] == param and error["error"]["message"]
    _, stats = await api.get("/stats")
    assert json.loads(stats)["router"]["requests"] == 0  # nothing was served


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
        assert a.engine.memory.gpu.pool.num_in_use == 0


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
