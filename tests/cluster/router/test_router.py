"""Router: views, in-flight accounting, routing with and without the metadata service, retries that
never repeat a token, bad input that changes nothing, metrics merging, the chat template."""

import asyncio
import dataclasses
import random
import threading
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from radixmesh.cluster.fleet.agent_client import LocalAgentClient, StaticAgentDirectory
from radixmesh.cluster.fleet.reports import agent_metrics
from radixmesh.cluster.launch.config import LauncherConfig
from radixmesh.cluster.launch.router_actor import deployment_layout
from radixmesh.cluster.observability.endpoints import merge_expositions
from radixmesh.cluster.observability.stats_log import StatsLogger
from radixmesh.cluster.policy.base import PolicyConfig, RouteRequest, make_policy
from radixmesh.cluster.policy.cost_model import CostModel, Holder
from radixmesh.cluster.policy.inflight import DECODE_WEIGHT, InflightTable
from radixmesh.cluster.policy.view import NodeView, build_view
from radixmesh.cluster.router.metrics import RouterMetrics
from radixmesh.cluster.router.results import NoNodeAvailable, RouterResult
from radixmesh.common.text.chat_template import ChatMessage, PlainChatTemplate
from radixmesh.node_agent.agent import NodeAgent
from radixmesh.proto.ids import NodeId
from radixmesh.proto.metadata.messages import MatchResult, NodeMatch
from radixmesh.proto.metadata.nodes import NodeInfo, NodeLoad
from radixmesh.proto.serve.limits import InvalidRequest
from radixmesh.proto.serve.plan import ServePlan, TokenDelta
from radixmesh.proto.serve.sampling import SamplingParams
from tests.support.agents import prompt
from tests.support.poll import until
from tests.support.router_cluster import BS, local_cluster, reference, start_metadata

pytestmark = pytest.mark.anyio

A, B, C, D = NodeId("a"), NodeId("b"), NodeId("c"), NodeId("d")


def request(rid: str, tokens: tuple[int, ...], max_tokens: int = 6, **kw: object) -> ServePlan:
    sampling = SamplingParams(max_tokens=max_tokens, ignore_eos=True, **kw)  # type: ignore[arg-type]
    return ServePlan(rid, tokens, sampling)


# --- bytes per block come from the agents --------------------------------------------------------
def test_router_prices_a_bf16_pull_at_half_the_bytes_of_float32() -> None:
    config = LauncherConfig()
    costs = {}
    for dtype in ("float32", "bfloat16"):
        layout = config.model.config.kv_layout("m", config.block_size, dtype)
        infos = [NodeInfo(n, 1, layout.fingerprint(), layout.block_size, layout.block_bytes, "x", 64) for n in (A, B)]
        fingerprint, block_bytes = deployment_layout(infos)
        assert (fingerprint, block_bytes) == (layout.fingerprint(), layout.block_bytes)
        policy = dataclasses.replace(config.router_config(fingerprint, block_bytes).policy_config, pull_latency_s=0.0)
        costs[dtype] = CostModel(policy).pull_time(10, bytes_per_s=1e9)
    assert costs["bfloat16"] * 2 == costs["float32"] > 0


def test_deployment_layout_refuses_agents_that_disagree() -> None:
    layout = LauncherConfig().model.config.kv_layout("m", 16)
    a = NodeInfo(A, 1, layout.fingerprint(), 16, layout.block_bytes, "x", 64)
    with pytest.raises(ValueError, match="one KV layout"):
        deployment_layout([a, dataclasses.replace(a, node_id=B, block_bytes=layout.block_bytes // 2)])
    with pytest.raises(ValueError, match="one KV layout"):
        deployment_layout([])


# --- in-flight table and views -------------------------------------------------------------------
ops = st.lists(st.tuples(st.sampled_from(["start", "prefilled", "finish"]), st.sampled_from([A, B, C]),
                         st.integers(0, 50), st.sampled_from([0.0, 0.0, 0.25, 1.5]), st.integers(0, 30)),
               max_size=40)


@settings(max_examples=60, deadline=None)
@given(ops)
def test_inflight_table_matches_a_counting_oracle(steps: list[tuple[str, NodeId, int, float, int]]) -> None:
    """In flight: started and not finished; queued tokens and planned pull seconds: not yet prefilled;
    decoding: prefilled and not finished."""
    table, tickets = InflightTable(), []
    oracle: list[list[object]] = []  # [node, tokens, pull_s, prefilled, finished]
    for op, node, tokens, pull_s, pick in steps:
        if op == "start":
            tickets.append(table.start(node, tokens, pull_s))
            oracle.append([node, tokens, pull_s, False, False])
        elif tickets:
            i = pick % len(tickets)
            if op == "prefilled":
                table.prefilled(tickets[i])
                oracle[i][3] = True
            else:
                table.finish(tickets[i])
                oracle[i][3] = oracle[i][4] = True
        table.check_invariants()
        for n in (A, B, C):
            mine = [o for o in oracle if o[0] == n]
            assert table.inflight(n) == sum(1 for o in mine if not o[4])
            assert table.queued_tokens(n) == sum(o[1] for o in mine if not o[3])  # type: ignore[misc]
            assert table.running_decodes(n) == sum(1 for o in mine if o[3] and not o[4])
            assert table.pulling_s(n) == pytest.approx(sum(o[2] for o in mine if not o[3]))  # type: ignore[misc]


def test_inflight_table_refuses_negative_tokens_and_changes_nothing() -> None:
    table = InflightTable()
    with pytest.raises(ValueError):
        table.start(A, -1)
    assert table.inflight(A) == 0 and table.queued_tokens(A) == 0
    table.check_invariants()


def test_inflight_table_measures_how_long_a_node_s_requests_decode() -> None:
    """First token to finish, a moving mean per node (DECODE_WEIGHT per request); a request that
    failed before its first token measured nothing; a node that left starts afresh; the view reads it."""
    now = [0.0]
    table = InflightTable(lambda: now[0])
    assert table.decode_s(A) == 0.0
    first, second, failed = table.start(A, 10), table.start(A, 10), table.start(A, 10)
    now[0] = 1.0
    table.prefilled(first)
    table.prefilled(second)
    now[0] = 5.0
    table.finish(first)
    assert table.decode_s(A) == pytest.approx(4.0)
    table.finish(failed)  # never got its first token
    assert table.decode_s(A) == pytest.approx(4.0)
    now[0] = 15.0
    table.finish(second)  # decoded 14 s
    assert table.decode_s(A) == pytest.approx(4.0 + DECODE_WEIGHT * (14.0 - 4.0))
    table.finish(second)  # idempotent: measured once
    assert table.decode_s(A) == pytest.approx(4.0 + DECODE_WEIGHT * 10.0)
    assert table.decode_s(B) == 0.0
    view = build_view([A, B], None, {}, table, 100.0)
    assert [v.decode_s for v in view.cluster.nodes] == [pytest.approx(5.0), 0.0]
    table.forget_recent(A)
    assert table.decode_s(A) == 0.0


def test_view_merges_index_pending_and_own_load() -> None:
    load = NodeLoad(prefill_tokens_per_s=500.0, pull_gbps={"a": 2.0, "c": 0.0}, step_floor_s=0.007)
    match = MatchResult(5, (NodeMatch(A, "127.0.0.1:1", 3, 5, 5, NodeLoad()),
                            NodeMatch(B, "127.0.0.1:2", 0, 0, 0, load)))
    table = InflightTable()
    table.start(B, 40)
    view = build_view([A, B, C], match, {C: 2, A: 1}, table, 100.0)
    assert view.cluster.nodes == (
        # 3..4 on host; no floor measured: the fleet's (B's) is borrowed.
        NodeView(A, gpu_blocks=3, local_blocks=5, prefill_tokens_per_s=100.0, held_blocks=3, step_floor_s=0.007),
        NodeView(B, queued_tokens=40, inflight=1, prefill_tokens_per_s=500.0, step_floor_s=0.007),
        NodeView(C, gpu_blocks=2, local_blocks=2, prefill_tokens_per_s=100.0, step_floor_s=0.007),  # pending: not held
    )
    assert dict(view.cluster.pull_bytes_per_s) == {(B, A): 2e9}
    assert view.addresses == {A: "127.0.0.1:1", B: "127.0.0.1:2"} and view.cluster_blocks == 5
    with pytest.raises(ValueError, match="no candidate"):
        build_view([], match, {}, table, 100.0)


def test_a_node_without_a_measured_floor_borrows_the_fleet_median_and_keeps_a_short_prefix_home() -> None:
    floors = {A: 0.009, B: 0.0, C: 0.003, D: 0.005}
    match = MatchResult(1, tuple(NodeMatch(n, f"127.0.0.1:{i}", 1 if n == A else 0, 0, 1 if n == A else 0,
                                           NodeLoad(prefill_tokens_per_s=2000.0, step_floor_s=f))
                                 for i, (n, f) in enumerate(floors.items())))
    view = build_view(list(floors), match, {}, InflightTable(), 2000.0)
    assert [v.step_floor_s for v in view.cluster.nodes] == [0.009, 0.005, 0.003, 0.005]
    # A's one cached block saves 16 tokens (8 ms): unpriced, B's missing floor (9 ms at A) won it.
    request = RouteRequest(17, 1, 16)
    assert make_policy("cost", PolicyConfig(), random.Random(0)).route(request, view.cluster).node == A
    unmeasured = build_view(list(floors), dataclasses.replace(match, nodes=tuple(
        dataclasses.replace(m, load=NodeLoad(prefill_tokens_per_s=2000.0)) for m in match.nodes)), {}, InflightTable(), 2000.0)
    assert all(v.step_floor_s == 0.0 for v in unmeasured.cluster.nodes)  # nothing measured: nothing to borrow


def test_the_wait_time_factor_slows_every_node_s_measured_rate_and_floor_alike() -> None:
    """What the engines' steps leave out (Calibration.wait_time_factor) stretches each node's wait:
    the cost model's queue and prefill of a prompt double at a factor of 2, its pull does not."""
    match = MatchResult(2, (NodeMatch(A, "127.0.0.1:1", 2, 2, 2, NodeLoad(prefill_tokens_per_s=1000.0,
                                                                       step_floor_s=0.01)),
                            NodeMatch(B, "127.0.0.1:2", 0, 0, 0, NodeLoad(prefill_tokens_per_s=500.0))))
    table = InflightTable()
    table.start(A, 300)
    one, two = (build_view([A, B], match, {}, table, 100.0, wait_time_factor=f).cluster for f in (1.0, 2.0))
    assert [(v.prefill_tokens_per_s, v.step_floor_s) for v in two.nodes] == [(500.0, 0.02), (250.0, 0.02)]
    assert two.wait_time_factor == 2.0
    model, request = CostModel(PolicyConfig()), RouteRequest(64, 4, 16)
    for a, b in zip(one.nodes, two.nodes, strict=True):
        est_one, est_two = model.estimate(request, a, None), model.estimate(request, b, None)
        assert (est_two.queue_s, est_two.prefill_s) == (pytest.approx(2 * est_one.queue_s),
                                                        pytest.approx(2 * est_one.prefill_s))
    pulled = model.estimate(request, two.nodes[1], Holder(A, 2, 1e12))
    assert pulled.pull_blocks == 2 and pulled.pull_s == pytest.approx(model.pull_time(2, 1e12))


def test_the_view_reads_a_prefix_tail_past_gpu_and_host_from_disk_at_the_node_s_rate() -> None:
    load = NodeLoad(prefill_tokens_per_s=100.0, disk_read_gbps=0.5)
    # gpu run 2, host run 3, some tier 7: blocks 3..6 are read from disk.
    match = MatchResult(7, (NodeMatch(A, "127.0.0.1:1", 2, 3, 7, load), NodeMatch(B, "127.0.0.1:2", 4, 0, 4, load)))
    view = build_view([A, B], match, {}, InflightTable(), 100.0)
    a, b = view.cluster.nodes
    assert (a.gpu_blocks, a.local_blocks, a.disk_blocks, a.disk_bytes_per_s) == (2, 7, 4, 5e8)
    assert a.held_blocks == 2  # a peer pulls from the gpu tier only
    assert (b.gpu_blocks, b.local_blocks, b.disk_blocks) == (4, 4, 0)


# --- routing and serving -------------------------------------------------------------------------
async def test_without_metadata_routes_least_loaded_and_output_is_exact() -> None:
    async with local_cluster(2, with_metadata=False) as c:
        r = c.router
        assert not r.metadata_available and r.active_policy == "least_loaded"
        tokens = prompt(1, 23)
        items = [i async for i in r.generate(request("q1", tokens, temperature=0.9))]
        result = items[-1]
        assert isinstance(result, RouterResult)
        seed = result.routed.plan.sampling.seed
        assert seed is not None  # the router fixed one
        expected = reference(tokens, dataclasses.replace(result.routed.plan.sampling))
        streamed = tuple(t for i in items[:-1] if isinstance(i, TokenDelta) for t in i.token_ids)
        assert streamed == result.result.output_token_ids == expected
        assert result.routed.policy == "least_loaded" and not result.routed.metadata_used
        assert r.metrics.status_counts == {"ok": 1} and r.metrics.total.prompt_tokens == 23
        assert r.metrics.stats().metadata_available == 0


async def test_agent_dying_mid_stream_is_retried_without_repeating_tokens() -> None:
    async with local_cluster(2, with_metadata=False) as c:
        tokens = prompt(2, 17)
        stream = c.router.generate(request("q2", tokens, max_tokens=40, temperature=0.8))
        first = await anext(stream)
        assert isinstance(first, TokenDelta)
        [victim] = [a for a in c.agents if c.router.inflight(a.node) == 1]
        await victim.stop()
        rest = [i async for i in stream]
        result = rest[-1]
        assert isinstance(result, RouterResult)
        tokens_out = first.token_ids + tuple(t for i in rest[:-1] if isinstance(i, TokenDelta) for t in i.token_ids)
        assert tokens_out == result.result.output_token_ids == reference(tokens, result.routed.plan.sampling)
        assert len(tokens_out) == 40 and result.attempts == 2 and result.result.node != victim.node
        assert c.router.metrics.retries == 1 and c.router.metrics.failed_attempts == {victim.node: 1}
        assert all(c.router.inflight(a.node) == 0 for a in c.agents)


async def test_every_agent_down_raises_no_node_available_and_leaves_no_load() -> None:
    async with local_cluster(2, with_metadata=False, max_attempts=3) as c:
        for a in c.agents:
            await a.stop()
        with pytest.raises(NoNodeAvailable):
            await c.router.complete(request("q3", prompt(3, 9)))
        assert c.router.metrics.status_counts == {"unavailable": 1} and c.router.metrics.retries == 2
        assert all(c.router.inflight(a.node) == 0 for a in c.agents)


@pytest.mark.parametrize("tokens, max_tokens, match", [
    ((), 4, "empty"), ((1, 2, 999), 4, "vocabulary"), ((1,) * 1000, 100, "context"),
])
async def test_bad_requests_are_rejected_and_change_nothing(tokens: tuple[int, ...], max_tokens: int,
                                                            match: str) -> None:
    async with local_cluster(1, with_metadata=False) as c:
        with pytest.raises(InvalidRequest, match=match):
            await c.router.complete(request("bad", tokens, max_tokens))
        assert c.router.metrics.routed == {} and c.router.metrics.status_counts == {"invalid": 1}
        assert c.router.inflight(A) == 0
        ok = await c.router.complete(request("good", prompt(4, 9)))
        assert ok.result.stats.tokens.local_gpu == 0  # the refused prompt left nothing behind


async def test_pending_holder_colocates_a_sibling_before_any_event() -> None:
    async with local_cluster(3) as c:
        tokens = prompt(5, 33)
        first = await c.router.complete(request("s1", tokens))
        sibling = await c.router.complete(request("s2", tokens + (1, 2, 3, 4, 5)))
        assert first.routed.policy == sibling.routed.policy == "cost" and sibling.routed.metadata_used
        assert sibling.result.node == first.result.node
        assert sibling.routed.decision.local_blocks == 33 // BS
        assert sibling.result.stats.tokens.local_gpu == (33 // BS) * BS


async def test_metadata_outage_degrades_to_least_loaded_and_recovery_resumes_prefix_routing() -> None:
    async with local_cluster(2) as c:
        r = c.router
        before = await r.complete(request("m1", prompt(6, 12)))
        assert before.routed.metadata_used and r.metadata_available
        await c.servers[-1].stop(0)
        # Until its watch stream reports the stop, the replica is as fresh as the last update and
        # routing on it is right; the outage starts for the router when the stream breaks.
        await until(lambda: r.watcher is None or not r.watcher.replica.in_sync, "the watch stream to report the stop")
        during = await r.complete(request("m2", prompt(7, 12)))
        assert not during.routed.metadata_used and during.routed.policy == "least_loaded"
        assert not r.metadata_available and r.active_policy == "least_loaded"
        assert r.metrics.stats().metadata_available == 0
        server, _ = await start_metadata(c.port)
        c.servers.append(server)
        # The channel reconnects on gRPC's backoff; each request probes again (metadata_retry_s=0).
        for i in range(200):
            after = await r.complete(request(f"m3-{i}", prompt(8, 12)))
            if after.routed.metadata_used:
                break
        assert after.routed.metadata_used and after.routed.policy == "cost" and r.metadata_available
        assert r.metrics.stats().metadata_available == 1


async def test_retry_interval_skips_the_metadata_service_until_it_passes() -> None:
    async with local_cluster(1, metadata_retry_s=30.0) as c:
        await c.servers[-1].stop(0)
        assert not (await c.router.complete(request("t1", prompt(9, 8)))).routed.metadata_used
        server, _ = await start_metadata(c.port)
        c.servers.append(server)
        assert not (await c.router.complete(request("t2", prompt(9, 8)))).routed.metadata_used
        for i in range(200):
            c.clock.now += 31.0
            if (await c.router.complete(request(f"t3-{i}", prompt(9, 8)))).routed.metadata_used:
                break
        assert c.router.metadata_available


# --- metrics --------------------------------------------------------------------------------------
async def test_metrics_merge_writes_each_family_once_with_node_labels() -> None:
    async with local_cluster(2, with_metadata=False) as c:
        await c.router.complete(request("x", prompt(10, 14)))
        texts = {a.node: await a.prometheus_text() for a in c.agents}
    merged = merge_expositions(c.router.metrics.render(), texts)
    types = [line.split()[2] for line in merged.splitlines() if line.startswith("# TYPE")]
    assert len(types) == len(set(types))
    families = {f.name: f for f in text_string_to_metric_families(merged)}
    agent_family = next(iter(text_string_to_metric_families(texts[A]))).name
    assert {s.labels["node"] for s in families[agent_family].samples} == {"a", "b"}
    assert families["radixmesh_prompt_tokens"].type == "counter"
    assert sum(s.value for s in families["radixmesh_prompt_tokens"].samples if s.name.endswith("_total")) == 14
    for name in ("radixmesh_router_requests", "radixmesh_routing_decisions", "radixmesh_remote_hit_blocks",
                 "radixmesh_transfer_bytes", "radixmesh_transfer_seconds", "radixmesh_router_ttft_seconds",
                 "radixmesh_routing_regret_tokens", "radixmesh_metadata_available"):
        assert name in families, name
    # No lifetime hit-rate gauge: the hit rate is a rate() ratio of radixmesh_prompt_tokens_total.
    assert "radixmesh_global_hit_rate" not in families


def test_metrics_merge_rejects_text_that_does_not_parse() -> None:
    with pytest.raises(ValueError):
        merge_expositions(RouterMetrics("m").render(), {A: "this is { not prometheus"})


# --- chat template --------------------------------------------------------------------------------
texts = st.text(st.characters(codec="utf-8"), max_size=20)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["system", "user", "assistant"]), texts), min_size=1, max_size=6),
       texts, texts)
def test_chat_history_is_a_growing_shared_prefix(history: list[tuple[str, str]], reply: str, nxt: str) -> None:
    msgs = [ChatMessage(role, text) for role, text in history]
    turn = PlainChatTemplate().render(msgs)
    assert PlainChatTemplate().render([*msgs, ChatMessage("assistant", reply), ChatMessage("user", nxt)]).startswith(turn)


def test_chat_template_is_the_documented_text_and_refuses_bad_roles() -> None:
    msgs = [ChatMessage("system", "Be brief."), ChatMessage("user", "Hi")]
    assert PlainChatTemplate().render(msgs) == "<|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\n"
    with pytest.raises(ValueError, match="role"):
        ChatMessage("tool", "x")
    with pytest.raises(ValueError):
        PlainChatTemplate().render([])


class CountedClient(LocalAgentClient):
    """A local agent whose metrics calls are counted while in flight, with its siblings' (`calls`)."""

    def __init__(self, agent: NodeAgent, calls: Counter[str]) -> None:
        super().__init__(agent)
        self.calls = calls

    async def prometheus_text(self) -> str:
        self.calls["now"] += 1
        self.calls["most"] = max(self.calls["most"], self.calls["now"])
        try:
            return await super().prometheus_text()
        finally:
            self.calls["now"] -= 1


SCRAPE_TIMEOUT_S = 2.0
"""Long enough for an idle agent to answer on a loaded box; the test waits it out once (the stuck ones)."""


async def test_agent_metrics_are_asked_at_once_and_a_stuck_agent_is_left_out() -> None:
    async with local_cluster(3, with_metadata=False) as c:
        calls: Counter[str] = Counter()
        directory = StaticAgentDirectory([CountedClient(a, calls) for a in c.agents])
        stuck = threading.Event()
        # Two agents whose engine threads are busy: their metrics cannot be read until released.
        holds = [asyncio.ensure_future(a.runner.call(stuck.wait)) for a in c.agents[:2]]
        try:
            texts = await agent_metrics(directory, SCRAPE_TIMEOUT_S)
        finally:
            stuck.set()
            await asyncio.gather(*holds)
    assert list(texts) == [c.agents[2].node]
    # All three were asked before any answered or timed out: asked one after another, each stuck
    # agent would be alone in flight, and the answering one would wait for both their timeouts.
    assert calls["most"] == 3 and calls["now"] == 0


async def test_the_stats_line_covers_the_window_since_the_last_one() -> None:
    async with local_cluster(2, with_metadata=False) as c:
        stats = StatsLogger(c.router, clock=lambda: c.clock.now)
        assert stats.line() is None  # nothing happened yet: nothing is logged
        tokens = prompt(12, 20)
        await c.router.complete(request("s1", tokens))
        await c.router.complete(request("s2", tokens))
        c.clock.now += 2.0
        line = stats.line()
        assert line is not None and line.startswith("router: 1.0 req/s, prompt 20 tok/s, hit rate ")
        assert "running 0, waiting 0, refused 0, retries 0" in line
        assert stats.line() is None  # the next window is empty again
