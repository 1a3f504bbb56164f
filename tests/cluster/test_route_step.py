"""RoutingStep, the routing step the router, Ray Serve's router and the simulator share: candidates
(given, or holders plus least-loaded), pinning and exclusion, the fallback without an index answer,
and what it records."""

import random

import pytest

from radixmesh.cluster.policy.base import PolicyConfig, make_policy
from radixmesh.cluster.policy.inflight import InflightTable
from radixmesh.cluster.policy.pending_index import PendingIndex
from radixmesh.cluster.policy.step import NoNodeAvailable, RoutingStep
from radixmesh.cluster.router.results import NoNodeAvailable as RouterNoNode
from radixmesh.cluster.sim.simulator import SimConfig, Simulator
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.ids import NodeId
from radixmesh.proto.metadata.messages import MatchResult, NodeMatch
from radixmesh.proto.metadata.nodes import NodeLoad

NODES = [NodeId(f"n{i}") for i in range(6)]
HASHES = [BlockHash(bytes([i]) * 16) for i in range(4)]


def step(policy: str = "cost", least_loaded: int = 2) -> RoutingStep:
    now = [0.0]
    table = InflightTable(lambda: now[0])
    return RoutingStep(make_policy(policy, PolicyConfig(), random.Random(0)), PendingIndex(10.0, lambda: now[0]),
                       table, block_tokens=4, default_prefill_tokens_per_s=1000.0, least_loaded=least_loaded,
                       fallback=make_policy("least_loaded", PolicyConfig(), random.Random(0)))


def held(node: NodeId, blocks: int) -> NodeMatch:
    return NodeMatch(node, f"tcp://{node}", blocks, 0, blocks, NodeLoad())


def test_narrow_candidates_are_holders_then_least_loaded_and_the_decision_is_pending() -> None:
    s = step()
    for n in NODES[:3]:
        s.table.record_routed(n, 100)
    s.pending.add(NODES[1], HASHES[:2])
    match = MatchResult(3, (held(NODES[4], 3),))
    routed = s.route(HASHES, 16, match, NODES, narrow=True, describe=lambda n: held(n, 0))
    # holders (indexed, then pending), then the 2 least loaded (never given work, by name: n3, n4)
    # that are not holders already
    assert [v.node for v in routed.view.cluster.nodes] == [NODES[4], NODES[1], NODES[3]]
    assert routed.view.cluster.fleet is not None and routed.view.cluster.fleet.nodes == len(NODES)
    assert routed.match is not None and [m.node_id for m in routed.match.nodes] == [NODES[4], NODES[3]]
    assert routed.policy == "cost"
    assert s.pending.match(HASHES)[routed.decision.node] == len(HASHES)


def test_exclude_pin_and_no_candidate() -> None:
    s = step()
    match = MatchResult(4, (held(NODES[0], 4),))
    routed = s.route(HASHES, 16, match, NODES, exclude=frozenset(NODES[:5]))
    assert [v.node for v in routed.view.cluster.nodes] == [NODES[5]]
    assert s.route(HASHES, 16, match, NODES, pin=NODES[2]).decision.node == NODES[2]
    assert s.route(HASHES, 16, match, NODES[:2], pin=NODES[3]).decision.node in NODES[:2]  # not a candidate
    with pytest.raises(NoNodeAvailable):
        s.route(HASHES, 16, match, NODES, exclude=frozenset(NODES))
    assert RouterNoNode is NoNodeAvailable  # the router raises the step's exception


def test_without_an_index_answer_the_fallback_decides_and_record_false_leaves_no_trace() -> None:
    s = step()
    routed = s.route(HASHES, 16, None, NODES, narrow=True, record=False)
    assert routed.policy == "least_loaded" and routed.match is None
    assert len(routed.view.cluster.nodes) == len(NODES)  # narrow needs an index answer
    assert s.pending.match(HASHES) == {}
    s.record(routed.decision.node, HASHES, 16)
    assert s.pending.match(HASHES) == {routed.decision.node: len(HASHES)}
    assert s.table.recent_tokens(routed.decision.node) == 16


def test_the_simulator_routes_through_the_step() -> None:
    sim = Simulator(SimConfig(nodes=4, capacity_blocks=10, routers=2, candidates=2))
    assert all(isinstance(r, RoutingStep) for r in sim._routers)
    assert sim._routers[0].policy is sim.policy and sim._routers[0].least_loaded == 2
