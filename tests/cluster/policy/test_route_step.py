"""RoutingStep, the routing step the router, Ray Serve's router and the simulator share: candidates
(given, or holders plus least-loaded), pinning and exclusion, the fallback without an index answer,
and what it records."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixmesh.cluster.policy.base import PolicyConfig, make_policy
from radixmesh.cluster.policy.inflight import InflightTable
from radixmesh.cluster.policy.pending_index import PendingIndex
from radixmesh.cluster.policy.step import NoNodeAvailable, RoutingStep
from radixmesh.cluster.router.results import NoNodeAvailable as RouterNoNode
from radixmesh.cluster.sim.config import SimConfig
from radixmesh.cluster.sim.simulator import Simulator
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


def test_two_requests_needing_one_uncached_prefix_prefill_it_once() -> None:
    """A burst's second request goes where the first computes the prefix, as the router runs it (the
    first's ticket in the table), on two idle nodes that share nothing."""
    s = step(least_loaded=0)
    prefix = [BlockHash(bytes([i + 1]) * 16) for i in range(16)]
    match = MatchResult(0, (held(NODES[0], 0), held(NODES[1], 0)))
    first = s.route(prefix, 64, match, NODES[:2]).decision
    s.table.start(first.node, 64)
    second = s.route(prefix, 66, match, NODES[:2]).decision
    assert (second.node, second.local_blocks, second.pull_from) == (first.node, 16, None)


def test_a_pending_holder_becomes_pullable_once_its_first_token_came_back() -> None:
    """Before its first token a routed node may still be computing the prefix (a pull would get
    nothing); after it, the router may plan a pull from it before its events reach the index."""
    s = step(least_loaded=0)
    prefix = [BlockHash(bytes([i + 1]) * 16) for i in range(16)]
    s.pending.add(NODES[0], prefix)
    match = MatchResult(0, (held(NODES[0], 0), held(NODES[1], 0)))

    def views() -> dict[NodeId, int]:
        routed = s.route(prefix, 64, match, NODES[:2], record=False)
        return {v.node: v.held_blocks for v in routed.view.cluster.nodes}

    assert views() == {NODES[0]: 0, NODES[1]: 0}
    s.computed(NODES[0], prefix[:10])
    assert views() == {NODES[0]: 10, NODES[1]: 0}
    s.computed(NODES[1], prefix)  # a node never routed the prompt is not made a holder by it
    assert views()[NODES[1]] == 0
    s.pending.check_invariants()


@settings(max_examples=80, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["add", "computed", "tick"]), st.sampled_from(NODES[:3]),
                              st.integers(0, 4), st.integers(0, 4)), max_size=30))
def test_pending_index_computed_matches_an_oracle(ops: list[tuple[str, NodeId, int, int]]) -> None:
    now = [0.0]
    index = PendingIndex(3.0, lambda: now[0])
    oracle: dict[tuple[BlockHash, NodeId], tuple[float, bool]] = {}  # (hash, node) -> (expiry, computed)
    for op, node, a, b in ops:
        hashes = HASHES[min(a, b): max(a, b)]
        if op == "add":
            index.add(node, hashes)
            for h in hashes:
                oracle[(h, node)] = (now[0] + 3.0, oracle.get((h, node), (0.0, False))[1])
        elif op == "computed":
            index.computed(node, hashes)
            for h in hashes:
                if (h, node) in oracle:
                    oracle[(h, node)] = (oracle[(h, node)][0], True)
        else:
            now[0] += 1.0
        oracle = {k: v for k, v in oracle.items() if v[0] > now[0]}
        for computed in (False, True):
            want: dict[NodeId, int] = {}
            for n in NODES[:3]:
                depth = 0
                while depth < len(HASHES) and (HASHES[depth], n) in oracle and (
                        not computed or oracle[(HASHES[depth], n)][1]):
                    depth += 1
                if depth:
                    want[n] = depth
            assert index.match(HASHES, computed=computed) == want
        index.check_invariants()


def test_inflight_table_refuses_a_negative_or_nan_pull() -> None:
    table = InflightTable()
    for bad in (-1.0, float("nan")):
        with pytest.raises(ValueError):
            table.start(NODES[0], 1, bad)
    assert table.inflight(NODES[0]) == 0 and table.pulling_s(NODES[0]) == 0.0
