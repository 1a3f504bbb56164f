"""The router on its index replica over real gRPC: no Match RPC once in sync, the same node choice
as Match would give, predictions still reaching hit accounting, and the candidate set of a decision
(prefix holders plus the least loaded) independent of the node count."""


import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from radixmesh.cluster.api.app import start_http
from radixmesh.cluster.policy.recent_work import RecentWork
from radixmesh.cluster.router.router import Router
from radixmesh.proto.ids import NodeId
from radixmesh.proto.metadata.messages import MatchQuery
from radixmesh.proto.serve.plan import ServePlan
from radixmesh.proto.serve.sampling import SamplingParams
from tests.support.agents import prompt
from tests.support.poll import until
from tests.support.router_cluster import BS, local_cluster

pytestmark = pytest.mark.anyio


def request(rid: str, tokens: tuple[int, ...]) -> ServePlan:
    return ServePlan(rid, tokens, SamplingParams(max_tokens=4, ignore_eos=True))


async def test_router_routes_on_its_replica_and_predictions_reach_hit_accounting() -> None:
    async with local_cluster(3, publish=True, pending_ttl_s=1.0) as c:
        r = c.router
        assert r.watcher is not None
        replica = r.watcher.replica
        r.start()
        await until(lambda: replica.in_sync and len(replica.nodes()) == 3)
        tokens = prompt(3, 5 * BS + 3)
        first = await r.complete(request("p1", tokens))
        assert first.routed.metadata_used and r.replica_decisions == 1
        hashes = r.block_hashes(request("p1", tokens))
        await until(lambda: replica.match(r.config.layout, hashes).cluster_blocks == 5)
        c.clock.now += 2.0  # the pending (speculative) holder has expired: only the replica knows
        second = await r.complete(request("p2", (*tokens, 9, 9)))
        assert r.replica_decisions == 2 and second.result.node == first.result.node
        assert second.routed.decision.local_blocks == 5
        assert r.metadata is not None
        [want] = await r.metadata.match([MatchQuery(r.config.layout, tuple(hashes))])
        assert want.nodes[0].node_id == first.result.node
        await until(lambda: c.service.stats().hits.total.predicted_local_tokens >= 5 * BS)
        assert c.service.stats().hits.total.realized_local_tokens >= 5 * BS


def test_least_loaded_candidates_follow_recent_work_without_decaying_every_node() -> None:
    now = [0.0]
    work = RecentWork(10.0, lambda: now[0])
    pool = [NodeId(f"n{i:03d}") for i in range(64)]
    assert work.least(3, pool, lambda n: True) == pool[:3]  # nobody had work: by name
    for i, n in enumerate(pool):
        work.add(n, 100.0 + i)
    now[0] = 25.0  # decay changes every value, not their order
    work.add(pool[10], 1000.0)
    assert work.least(3, pool, lambda n: True) == pool[:3]
    assert work.least(2, pool, lambda n: n != pool[0]) == pool[1:3]
    assert work.least(2, pool[5:], lambda n: True) == pool[5:7]
    total = sum(work.value(n) for n in pool)
    assert abs(work.total() - total) < 1e-6 * total
    work.check_invariants()


async def test_router_replicas_share_routed_work_through_the_stream() -> None:
    async with local_cluster(3, publish=True) as c:
        other = Router(c.router.config, c.directory, c.router.metadata, clock=c.clock)
        try:
            for r in (c.router, other):
                r.start()
                assert r.watcher is not None
                replica = r.watcher.replica
                await until(lambda rep=replica: rep.in_sync and len(rep.nodes()) == 3)
            tokens = prompt(4, 3 * BS)
            routed = await c.router.plan(request("w1", tokens))
            node = routed.decision.node
            # The other router learns of the work from the metadata stream, not from routing it.
            await until(lambda: other.recent_tokens(node) >= len(tokens))
            assert c.router.recent_tokens(node) == 0  # plan alone records nothing here: serving does
        finally:
            await other.close()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "least", "tick"]), st.integers(0, 11), st.integers(0, 50),
                          st.integers(1, 5)), max_size=60))
def test_least_loaded_matches_a_brute_force_ranking(steps: list[tuple[str, int, int, int]]) -> None:
    now = [0.0]
    work = RecentWork(10.0, lambda: now[0])
    nodes = [NodeId(f"n{i:02d}") for i in range(12)]
    for kind, i, amount, k in steps:
        if kind == "add":
            work.add(nodes[i], float(amount))
        elif kind == "tick":
            now[0] += amount / 10
        else:
            pool = nodes[: 4 + i % 8]  # the pool changes size now and then
            banned = {nodes[(i + 1) % len(pool)]}
            got = work.least(k, pool, lambda n, b=banned: n not in b)  # type: ignore[misc]
            usable = [n for n in pool if n not in banned]
            fresh = sorted(n for n in usable if n not in work._key)
            ranked = sorted((n for n in usable if n in work._key), key=lambda n: (work.value(n), n))
            want = (fresh + ranked)[:k]
            assert got[: len(fresh)] == want[: len(fresh)] and len(got) == len(want)
            # Among nodes given work, equal values may come in either order: compare the values.
            assert [round(work.value(n), 6) for n in got] == [round(work.value(n), 6) for n in want]
        work.check_invariants()


async def test_the_router_metrics_say_whether_its_replica_follows_the_index() -> None:
    """The index watcher's restarts and in-sync gauge are on the router's /metrics (a frozen replica
    must be visible where the operator looks)."""
    async with local_cluster(2, publish=True) as c:
        r = c.router
        assert r.watcher is not None
        r.start()
        await until(lambda: r.watcher is not None and r.watcher.replica.in_sync)
        runner, port = await start_http(r, "127.0.0.1", 0)
        try:
            async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/metrics") as resp:
                text = await resp.text()
        finally:
            await runner.cleanup()
        samples = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
        assert samples["radixmesh_index_replica_in_sync"] == 1
        assert samples["radixmesh_index_watch_restarts_total"] == 0
