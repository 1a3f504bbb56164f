"""Prefill/decode disaggregation in the router (issue 37), on real agents (tiny seeded model, UCX on
127.0.0.1) and a real metadata service: the prompt is prefilled on a prefill agent, the decode agent
pulls its blocks and generates the same tokens as one cache-less engine; a failed pull is recomputed,
a dead prefill agent is replaced by another, and with none left the request fails cleanly."""

import contextlib
from collections.abc import AsyncGenerator

import pytest

from radixmesh.cluster.fleet.agent_client import AgentUnavailable, LocalAgentClient
from radixmesh.cluster.router.disaggregation import local_holder, overlap_s
from radixmesh.cluster.router.results import NoNodeAvailable
from radixmesh.cluster.router.router import Router
from radixmesh.node_agent.agent import NodeAgent
from radixmesh.proto.ids import NodeId
from radixmesh.proto.metadata.messages import MatchResult, NodeLoad, NodeMatch
from radixmesh.proto.serve.limits import usable_prefix_blocks
from radixmesh.proto.serve.plan import Queued, ServeItem, ServePlan
from radixmesh.proto.serve.sampling import SamplingParams
from tests.support.agents import prompt
from tests.support.poll import until
from tests.support.router_cluster import BS, local_cluster, reference

pytestmark = pytest.mark.anyio
SAMPLING = SamplingParams(max_tokens=6, ignore_eos=True)


def request(rid: str, tokens: tuple[int, ...]) -> ServePlan:
    return ServePlan(rid, tokens, SAMPLING)



async def test_the_prompt_is_prefilled_on_the_prefill_agent_and_decoded_from_its_pulled_kv() -> None:
    async with local_cluster(2, publish=True, transfer="ucx", roles=("prefill", "decode")) as c:
        await c.router_in_sync()
        tokens = prompt(1, 5 * BS + 3)
        result = await c.router.complete(request("r1", tokens))
        stats = result.result.stats
        assert result.result.node == NodeId("b") and result.routed.plan.pull is not None
        assert result.routed.plan.pull.peer == NodeId("a")
        assert stats.tokens.remote == usable_prefix_blocks(len(tokens), BS) * BS and not stats.pull_failed
        assert result.result.output_token_ids == reference(tokens, SAMPLING)
        m = c.router.metrics
        assert m.handoffs == {"pulled": 1} and m.handoff_bytes == stats.pull_bytes > 0
        assert m.role_decisions == {"prefill": 1, "decode": 1}
        # The prompt's tokens count once, as the prefill agent computed them (the hit rate's source),
        # at the router and at the metadata service (from the agents' heartbeats).
        assert m.total.requests == 1 and m.total.tokens.computed == len(tokens)
        # A request served on the decode agent after it: once its report is in, any the hand-off made is too.
        marker = prompt(99, 2 * BS + 1)
        async with contextlib.aclosing(c.agent("b").serve(request("marker", marker))) as items:
            async for _ in items:
                pass
        await until(lambda: c.service.stats().hits.total.requests >= 2)
        hits = c.service.stats().hits.total
        assert (hits.requests, hits.prompt_tokens, hits.remote_tokens) == (2, len(tokens) + len(marker), 0)
        await c.agent("a").check_invariants()
        await c.agent("b").check_invariants()


async def test_while_the_decode_agent_streams_the_prefill_agent_has_nothing_in_flight() -> None:
    # Not streamed: the decode phase begins once the prefill phase has ended.
    async with local_cluster(2, publish=True, transfer="ucx", roles=("prefill", "decode"), stream_handoff=False) as c:
        await c.router_in_sync()
        seen = []
        async with contextlib.aclosing(c.router.generate(request("r1", prompt(8, 3 * BS + 1)))) as items:
            async for _ in items:
                seen.append(c.router.metrics.stats().role_inflight)
        assert seen[0] == {"prefill": 0, "decode": 1}
        assert c.router.metrics.stats().role_inflight == {"prefill": 0, "decode": 0}


async def test_an_aggregated_cluster_is_served_in_one_phase() -> None:
    async with local_cluster(2, publish=True, transfer="ucx") as c:
        await c.router_in_sync()
        result = await c.router.complete(request("r1", prompt(1, 5 * BS + 3)))
        assert result.routed.plan.pull is None and c.router.metrics.handoffs == {}
        assert c.router.metrics.role_decisions == {"both": 1}


async def test_the_next_turn_is_prefilled_with_the_prefix_pulled_from_the_decode_agent() -> None:
    async with local_cluster(2, publish=True, transfer="ucx", roles=("prefill", "decode")) as c:
        await c.router_in_sync()
        r = c.router
        first = prompt(2, 6 * BS + 5)
        await r.complete(request("t1", first))
        await c.agent("a").reset_prefix_cache()  # the prefill agent forgets it: only the decode agent has it
        c.clock.now += 3600  # and the router's pending record of it expires
        assert r.watcher is not None
        hashes = r.block_hashes(request("t1", first))[:6]
        await until(lambda: {m.node_id for m in r.watcher.replica.match(r.config.layout, hashes).nodes} == {"b"})
        second = (*first, *prompt(3, 2 * BS))
        routed = await r.plan(request("t2", second), among=frozenset({NodeId("a")}))
        assert routed.decision.node == NodeId("a") and routed.plan.pull is not None
        assert routed.plan.pull.peer == NodeId("b") and routed.decision.pull_blocks >= 5
        if routed.hold is not None:
            r._step.abandon(routed.hold)


async def test_a_hand_off_that_cannot_pull_is_recomputed_by_the_decode_agent_with_the_same_tokens() -> None:
    async with local_cluster(2, publish=True, transfer="ucx", roles=("prefill", "decode")) as c:
        await c.router_in_sync()
        tokens = prompt(4, 4 * BS + 1)
        c.router._split._address_of = lambda node: "127.0.0.1:1"  # nobody listens there
        result = await c.router.complete(request("r1", tokens))
        assert result.result.node == NodeId("b") and result.result.stats.pull_failed
        assert result.result.stats.tokens.remote == 0
        assert result.result.output_token_ids == reference(tokens, SAMPLING)
        assert c.router.metrics.handoffs == {"recomputed": 1}
        await c.agent("b").check_invariants()


class StopsAfterServing:
    """A prefill agent's client that stops the agent once its stream is closed: the agent dies after
    its prefill and before the decode agent's pull."""

    def __init__(self, agent: NodeAgent) -> None:
        self.agent, self.node = agent, agent.node
        self._client = LocalAgentClient(agent)

    async def serve(self, plan: ServePlan) -> AsyncGenerator[ServeItem, None]:
        try:
            async with contextlib.aclosing(self._client.serve(plan)) as items:
                async for item in items:
                    yield item
        finally:
            await self.agent.stop()


async def test_a_prefill_agent_killed_before_the_hand_off_costs_a_recompute_not_wrong_tokens() -> None:
    # Not streamed, so the hand-off begins after the prefill agent's stream closed (it stops then).
    async with local_cluster(2, publish=True, transfer="ucx", roles=("prefill", "decode"), stream_handoff=False) as c:
        await c.router_in_sync()
        c.directory.add(StopsAfterServing(c.agent("a")), "prefill")  # type: ignore[arg-type]
        tokens = prompt(7, 6 * BS + 3)
        result = await c.router.complete(request("r1", tokens))
        assert result.result.node == NodeId("b") and result.result.stats.pull_failed
        assert result.result.output_token_ids == reference(tokens, SAMPLING)
        await c.agent("b").check_invariants()


async def test_a_dead_prefill_agent_is_replaced_by_another_and_none_left_fails_cleanly() -> None:
    async with local_cluster(3, publish=True, transfer="ucx", roles=("prefill", "prefill", "decode")) as c:
        await c.router_in_sync()
        r: Router = c.router
        tokens = prompt(5, 3 * BS + 2)
        await c.agent("a").stop()
        result = await r.complete(request("r1", tokens))
        assert result.result.node == NodeId("c") and result.routed.plan.pull is not None
        assert result.routed.plan.pull.peer == NodeId("b")
        assert result.result.output_token_ids == reference(tokens, SAMPLING)
        await c.agent("b").stop()
        with pytest.raises(NoNodeAvailable):
            await r.complete(request("r2", prompt(6, 3 * BS + 2)))
        assert r.metrics.status_counts.get("unavailable") == 1


async def test_with_its_only_decode_agent_dead_a_request_fails_cleanly_and_nothing_leaks() -> None:
    async with local_cluster(2, publish=True, transfer="ucx", roles=("prefill", "decode")) as c:
        await c.router_in_sync()
        await c.agent("b").stop()
        with pytest.raises(NoNodeAvailable):
            await c.router.complete(request("r1", prompt(9, 3 * BS + 2)))
        assert c.router.metrics.status_counts == {"unavailable": 1} and c.router.metrics.handoffs == {}
        await c.agent("a").check_invariants()


async def test_a_streamed_hand_off_follows_the_prefill_and_decodes_the_same_tokens() -> None:
    async with local_cluster(2, publish=True, transfer="ucx", roles=("prefill", "decode")) as c:
        await c.router_in_sync()
        tokens = prompt(10, 9 * BS + 2)
        result = await c.router.complete(request("r1", tokens))
        pull, stats = result.routed.plan.pull, result.result.stats
        assert pull is not None and pull.peer == NodeId("a") and pull.follow  # sent once the prompt was queued
        assert result.result.output_token_ids == reference(tokens, SAMPLING)
        assert stats.tokens.remote == usable_prefix_blocks(len(tokens), BS) * BS and not stats.pull_failed
        m = c.router.metrics
        assert m.handoffs == {"pulled": 1} and m.handoff_overlap.count == m.handoff_seconds.count == 1
        assert 0.0 <= m.handoff_overlap.sum <= m.handoff_seconds.sum
        # The prefill phase's result is in before the decode phase's: the prompt counted once, as computed.
        assert m.total.requests == 1 and m.total.tokens.computed == len(tokens)
        await c.agent("a").check_invariants()
        await c.agent("b").check_invariants()


async def test_not_streamed_the_hand_off_begins_after_the_prefill_and_overlaps_nothing() -> None:
    async with local_cluster(2, publish=True, transfer="ucx", roles=("prefill", "decode"), stream_handoff=False) as c:
        await c.router_in_sync()
        tokens = prompt(11, 5 * BS + 1)
        result = await c.router.complete(request("r1", tokens))
        assert result.routed.plan.pull is not None and not result.routed.plan.pull.follow
        assert result.result.output_token_ids == reference(tokens, SAMPLING)
        m = c.router.metrics
        assert m.handoffs == {"pulled": 1} and (m.handoff_overlap.count, m.handoff_overlap.sum) == (1, 0.0)


class StopsOnceQueued:
    """A prefill agent's client that stops the agent as soon as it has queued the prompt: it dies
    while the decode agent's pull follows it, and its stream breaks as a dead process's does (a
    prefill that finished before the stop cannot reach the router)."""

    def __init__(self, agent: NodeAgent) -> None:
        self.agent, self.node = agent, agent.node
        self._client = LocalAgentClient(agent)

    async def serve(self, plan: ServePlan) -> AsyncGenerator[ServeItem, None]:
        async with contextlib.aclosing(self._client.serve(plan)) as items:
            async for item in items:
                yield item
                if isinstance(item, Queued):
                    await self.agent.stop()
                    raise AgentUnavailable(f"agent {self.node} stopped")


async def test_a_prefill_agent_that_dies_while_followed_costs_a_recompute_not_wrong_tokens() -> None:
    async with local_cluster(2, publish=True, transfer="ucx", roles=("prefill", "decode")) as c:
        await c.router_in_sync()
        c.directory.add(StopsOnceQueued(c.agent("a")), "prefill")  # type: ignore[arg-type]
        tokens = prompt(12, 7 * BS + 3)
        result = await c.router.complete(request("r1", tokens))
        assert result.result.node == NodeId("b") and result.routed.plan.pull is not None
        assert result.result.output_token_ids == reference(tokens, SAMPLING)
        assert c.router.metrics.failed_attempts == {NodeId("a"): 1}  # its prefill phase failed, the request did not
        await c.agent("b").check_invariants()


def test_the_overlap_is_the_hand_off_before_the_prefill_ended() -> None:
    assert overlap_s(10.0, 12.5, 20.0, 4.0) == 2.5  # pull [10, 14), prefill ended at 12.5
    assert overlap_s(10.0, 16.0, 20.0, 4.0) == 4.0  # the whole pull ran during the prefill
    assert overlap_s(10.0, 9.0, 20.0, 4.0) == 0.0  # begun after the prefill (not streamed)
    assert overlap_s(10.0, None, 11.0, 4.0) == 1.0  # no prefill result came (it failed): up to now


@pytest.mark.parametrize("limit", [256, 0])
async def test_a_next_turn_the_decode_agent_holds_but_a_short_tail_is_served_there_whole(limit: int) -> None:
    # local_prefill_max_tokens: a turn whose conversation the decode agent holds, but for a tail of at
    # most that many tokens, is served there in one phase (no prefill agent, no hand-off); 0: two phases.
    async with local_cluster(2, publish=True, transfer="ucx", roles=("prefill", "decode"),
                             local_prefill_max_tokens=limit) as c:
        await c.router_in_sync()
        r = c.router
        first = prompt(2, 6 * BS + 5)
        await r.complete(request("t1", first))
        assert r.watcher is not None
        hashes = r.block_hashes(request("t1", first))[:6]
        await until(lambda: any(m.node_id == "b" and m.gpu_blocks == 6
                                for m in r.watcher.replica.match(r.config.layout, hashes).nodes))
        second = (*first, *prompt(3, 2 * BS))
        result = await r.complete(request("t2", second))
        assert result.result.node == NodeId("b")
        assert result.result.output_token_ids == reference(second, SAMPLING)
        if limit:
            assert r.metrics.handoffs == {"pulled": 1}  # the first turn's only
            assert r.metrics.role_decisions == {"prefill": 1, "decode": 2}
            assert result.result.stats.tokens.remote == 0 and result.result.stats.tokens.computed <= limit
        else:
            assert r.metrics.handoffs == {"pulled": 2}
            assert r.metrics.role_decisions == {"prefill": 2, "decode": 2}
        # A tail longer than the limit: two phases (the prefill agent computes it).
        third = (*second, *prompt(4, limit + 2 * BS))
        await r.complete(request("t3", third))
        assert r.metrics.role_decisions["prefill"] == (2 if limit else 3)
        await c.agent("a").check_invariants()
        await c.agent("b").check_invariants()


def test_the_local_holder_is_the_decode_agent_with_the_longest_prefix_within_the_limit() -> None:
    def held(node: str, blocks: int) -> NodeMatch:
        return NodeMatch(NodeId(node), "", blocks, 0, blocks, NodeLoad())
    match = MatchResult(8, (held("p", 8), held("d1", 6), held("d2", 7)))
    decode = frozenset({NodeId("d1"), NodeId("d2")})
    assert local_holder(match, decode, 8 * BS + 3, BS, 2 * BS) == NodeId("d2")  # 1 block and 3 tokens left
    assert local_holder(match, decode, 8 * BS + 3, BS, BS) is None  # more than the limit left
    assert local_holder(match, frozenset({NodeId("d1")}), 8 * BS + 3, BS, 3 * BS) == NodeId("d1")
    assert local_holder(match, frozenset({NodeId("x")}), 8 * BS + 3, BS, 100 * BS) is None  # no decode holder
