"""The router's HTTP API on 127.0.0.1: OpenAI shapes, SSE streaming, errors that change nothing,
/stats, /metrics, /healthz, /v1/models."""

import json
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from radixmesh.common.text.chat_template import ChatMessage, PlainChatTemplate
from radixmesh.proto.events import Tier
from tests.support.router_cluster import MODEL_NAME
from tests.support.router_http import PROMPT, TOK, Api, api, greedy

pytestmark = [pytest.mark.anyio, pytest.mark.integration]
__all__ = ["api", "greedy"]  # the fixture, and what test_security_http imports from here


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
    ("/v1/completions", {"model": MODEL_NAME, "prompt": "x", "n": 0}, 400, "n"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": "x", "n": 17}, 400, "n"),
    ("/v1/chat/completions", {"model": MODEL_NAME, "messages": [{"role": "user", "content": "x"}], "n": "2"}, 400,
     "n"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": "x", "n": 2, "seed": 2**63 - 1}, 400, "seed"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": "x", "stop": 5}, 400, "stop"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": "x", "stop_token_ids": [9999]}, 400, "stop_token_ids"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": "x", "stop_token_ids": 3}, 400, "stop_token_ids"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": "x", "ignore_eos": "yes"}, 400, "ignore_eos"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": "x", "cache_salt": 5}, 400, "cache_salt"),
    # The field policy: unknown names (typos) and unimplemented OpenAI/vLLM options are refused by name.
    ("/v1/completions", {"model": MODEL_NAME, "prompt": "x", "max_token": 5}, 400, "max_token"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": "x", "messages": []}, 400, "messages"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": "x", "logprobs": 21}, 400, "logprobs"),
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
        assert a.memory.block_counts(Tier.GPU).in_use == 0


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
    # each decision beside its outcome: the last two, asked for after the first
    _, text = await api.get("/stats/decisions?after=1")
    decisions = json.loads(text)
    assert decisions["decisions"] == 2 and decisions["first_seq"] == 2 and decisions["last_seq"] == 3
    assert decisions["prefill_tokens"]["realized"] == router["computed"] - (usages[0]["prompt_tokens"] - (
        usages[0]["prompt_tokens_details"]["cached_tokens"]))


@pytest.mark.parametrize("after", ["-1", "x", "1.5", "9" * 19, "１"])
async def test_stats_decisions_refuses_a_bad_after(api: Api, after: str) -> None:
    status, text = await api.get(f"/stats/decisions?after={after}")
    assert status == 400 and json.loads(text)["error"]["param"] == "after"


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
