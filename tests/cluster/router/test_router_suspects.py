"""Suspects: a node whose attempt failed gets no new requests while another node is left, until its
hold passes or it registers afresh; a lone node is tried anyway."""

import random
from collections.abc import AsyncGenerator

import pytest

from radixmesh.cluster.fleet.agent_client import AgentUnavailable, LocalAgentClient, StaticAgentDirectory
from radixmesh.cluster.router.results import NoNodeAvailable
from radixmesh.cluster.router.router import Router
from radixmesh.cluster.router.suspects import DEFAULT_HOLD_S, Suspects
from radixmesh.proto.ids import NodeId
from radixmesh.proto.metadata.messages import IndexUpdate, WatchedNode
from radixmesh.proto.metadata.nodes import NodeLoad
from radixmesh.proto.serve.plan import ServeItem, ServePlan
from radixmesh.proto.serve.sampling import SamplingParams
from tests.support.agents import prompt
from tests.support.router_cluster import ManualClock, local_cluster, router_config

pytestmark = pytest.mark.anyio


def request(rid: str, seed: int) -> ServePlan:
    return ServePlan(rid, prompt(seed, 21), SamplingParams(max_tokens=3, ignore_eos=True))


def test_a_suspect_is_held_until_its_hold_passes_or_it_is_seen_alive() -> None:
    clock = ManualClock()
    s = Suspects(clock, hold_s=5.0)
    a, b = NodeId("a"), NodeId("b")
    s.failed(a)
    s.failed(b)
    clock.now += 4.9
    assert s.current() == {a, b}
    s.seen_alive(b)
    assert s.current() == {a}
    clock.now += 0.1
    assert s.current() == frozenset()
    s.failed(a)  # failing again starts a new hold
    clock.now += 4.9
    assert s.current() == {a}


async def test_a_stopped_agent_costs_one_failed_attempt_not_one_per_request() -> None:
    async with local_cluster(2, with_metadata=False) as c:
        victim, survivor = c.agents
        await victim.stop()
        results = [await c.router.complete(request(f"r{i}", i)) for i in range(8)]
        # Least-loaded ties are broken at random: without the hold about half of the eight would try
        # the stopped agent first.
        assert c.router.metrics.failed_attempts == {victim.node: 1}
        assert {r.result.node for r in results} == {survivor.node}
        assert c.router.suspects.current() == {victim.node}
        c.clock.now += DEFAULT_HOLD_S
        assert c.router.suspects.current() == frozenset()  # tried again after its hold


async def test_an_agent_that_registers_afresh_is_no_suspect() -> None:
    async with local_cluster(2, publish=True) as c:
        victim = c.agents[0]
        c.router.suspects.failed(victim.node)
        watcher = c.router.watcher
        assert watcher is not None and watcher.on_update is not None
        seen = WatchedNode(victim.node, victim.layout.fingerprint(), "", 16, NodeLoad())
        watcher.on_update(IndexUpdate(seq=1, nodes=(seen,)))  # a load report: maybe sent before it died
        assert c.router.suspects.current() == {victim.node}
        watcher.on_update(IndexUpdate(seq=2, left=(victim.node,), nodes=(seen,)))  # a fresh registration
        assert c.router.suspects.current() == frozenset()


class FailsOnce(LocalAgentClient):
    """A local agent whose first serve fails as an unreachable agent's would."""

    failed = False

    async def serve(self, plan: ServePlan) -> AsyncGenerator[ServeItem, None]:
        if not self.failed:
            self.failed = True
            raise AgentUnavailable(f"agent {self.node}: connection reset")
        async for item in super().serve(plan):
            yield item


async def test_a_lone_agent_is_tried_though_its_last_attempt_failed() -> None:
    async with local_cluster(1, with_metadata=False) as c:
        [agent] = c.agents
        config = router_config(agent.layout.fingerprint(), max_attempts=1)
        router = Router(config, StaticAgentDirectory([FailsOnce(agent)]), None, clock=c.clock,
                        rng=random.Random(0))
        with pytest.raises(NoNodeAvailable):
            await router.complete(request("first", 1))
        assert router.suspects.current() == {agent.node}
        served = await router.complete(request("second", 2))
        assert served.result.node == agent.node
