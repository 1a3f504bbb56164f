"""Pending holds (issue 35): a routed request's blocks count as held by its node while the request
waits, however long its queue, until its first token (then `ttl_s` more for the node's events to
reach the index), or until it fails (at once); `max_hold_s` bounds a hold whose answer never comes."""

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from radixmesh.cluster.policy.base import PolicyConfig, make_policy
from radixmesh.cluster.policy.inflight import InflightTable
from radixmesh.cluster.policy.pending_index import PendingHold, PendingIndex
from radixmesh.cluster.policy.step import RoutingStep
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.ids import NodeId
from radixmesh.proto.metadata.messages import MatchResult, NodeMatch
from radixmesh.proto.metadata.nodes import NodeLoad
from tests.support.hashes import h

A, B, C = NodeId("a"), NodeId("b"), NodeId("c")
CHAIN = [BlockHash(bytes([i + 1]) * 16) for i in range(8)]
TTL, MAX = 5.0, 60.0


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def index() -> tuple[PendingIndex, Clock]:
    clock = Clock()
    return PendingIndex(TTL, clock, max_hold_s=MAX), clock


def test_a_hold_outlasts_the_ttl_while_its_request_waits() -> None:
    p, clock = index()
    p.hold(A, CHAIN[:4])
    clock.now = 4 * TTL  # queued far longer than the ttl: still pending
    assert p.match(CHAIN) == {A: 4}
    p.check_invariants()


def test_an_answered_hold_ends_ttl_after_its_answer() -> None:
    p, clock = index()
    hold = p.hold(A, CHAIN[:4])
    clock.now = 20.0
    p.release(hold)
    clock.now = 20.0 + TTL - 0.1
    assert p.match(CHAIN) == {A: 4}
    clock.now = 20.0 + TTL
    assert p.match(CHAIN) == {} and len(p) == 0
    p.release(hold)  # a hold already gone is left alone
    p.check_invariants()


def test_a_failed_hold_ends_at_once_and_leaves_the_other_requests_holds() -> None:
    p, _ = index()
    first = p.hold(A, CHAIN[:4])
    second = p.hold(A, CHAIN[:2])
    p.computed(A, CHAIN[:2])
    p.release(first, failed=True)
    assert p.match(CHAIN) == {A: 2} and p.match(CHAIN, computed=True) == {A: 2}
    p.release(second, failed=True)
    assert p.match(CHAIN) == {} and p.match(CHAIN, computed=True) == {}
    p.check_invariants()


def test_a_hold_never_answered_ends_at_max_hold_s() -> None:
    p, clock = index()
    p.hold(A, CHAIN[:4])
    clock.now = MAX - 0.1
    assert p.match(CHAIN) == {A: 4}
    clock.now = MAX
    assert p.match(CHAIN) == {} and len(p) == 0
    p.check_invariants()


def test_a_plain_record_lasts_the_ttl_from_now() -> None:
    p, clock = index()
    p.add(B, CHAIN[:3])
    clock.now = TTL
    assert p.match(CHAIN) == {}


@settings(max_examples=150, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["hold", "add", "answer", "fail", "computed", "tick"]),
                              st.sampled_from([A, B, C]), st.integers(0, 4), st.integers(0, 60)), max_size=40))
def test_pending_holds_match_an_oracle(ops: list[tuple[str, NodeId, int, int]]) -> None:
    """Per hold: live while open (at most MAX), TTL after its answer, gone on failure; a plain record
    lives TTL. A (hash, node) pair is pending while a live record covers it, and computed once marked
    so while pending."""
    p, clock = index()
    made: list[PendingHold] = []
    oracle: dict[int, tuple[PendingHold, float, bool]] = {}  # id -> (record, its end, open)
    computed: set[tuple[BlockHash, NodeId]] = set()

    def live() -> set[tuple[BlockHash, NodeId]]:
        return {(h, r.node) for r, _, _ in oracle.values() for h in r.hashes}

    for op, node, n, k in ops:
        if op in ("hold", "add"):
            record = p.hold(node, CHAIN[:n]) if op == "hold" else p.add(node, CHAIN[:n])
            made.append(record)
            oracle[id(record)] = (record, clock.now + (MAX if op == "hold" else TTL), op == "hold")
        elif op in ("answer", "fail") and made:
            record = made[k % len(made)]
            p.release(record, failed=op == "fail")
            if id(record) in oracle and op == "fail":
                del oracle[id(record)]
            elif id(record) in oracle and oracle[id(record)][2]:
                oracle[id(record)] = (record, clock.now + TTL, False)
        elif op == "computed":
            p.computed(node, CHAIN[:n])
            computed |= {(h, node) for h in CHAIN[:n]} & live()
        elif op == "tick":
            clock.now += k / 10
        oracle = {i: o for i, o in oracle.items() if o[1] > clock.now}
        computed &= live()
        for only_computed in (False, True):
            pairs = computed if only_computed else live()
            want = {}
            for m in (A, B, C):
                depth = 0
                while depth < len(CHAIN) and (CHAIN[depth], m) in pairs:
                    depth += 1
                if depth:
                    want[m] = depth
            assert p.match(CHAIN, computed=only_computed) == want
        p.check_invariants()


def held(node: NodeId, blocks: int) -> NodeMatch:
    return NodeMatch(node, f"tcp://{node}", blocks, 0, blocks, NodeLoad())


def test_a_turn_arriving_while_its_previous_turn_waits_past_the_ttl_goes_where_that_turn_is_queued() -> None:
    """Turn 1 of a conversation waits in node a's queue longer than the ttl (nothing indexed yet); turn
    2 resends it plus a reply and a question. Under the old fixed ttl turn 1's blocks were neither
    indexed nor pending by then, and `cost` sent turn 2 to the idle node to compute it all again."""
    clock = Clock()
    table = InflightTable(clock)
    step = RoutingStep(make_policy("cost", PolicyConfig(), random.Random(0)),
                       PendingIndex(TTL, clock, max_hold_s=MAX), table, block_tokens=16,
                       default_prefill_tokens_per_s=1000.0)
    nothing = MatchResult(0, (held(A, 0), held(B, 0)))
    first = step.route(CHAIN[:4], 64, nothing, [A, B])
    assert first.hold is not None
    table.start(first.decision.node, 64)  # queued there, not prefilled
    table.record_routed(first.decision.node, 64)
    clock.now = 3 * TTL
    second = step.route(CHAIN[:6], 96, nothing, [A, B]).decision
    assert (second.node, second.local_blocks) == (first.decision.node, 4)
    node = first.decision.node
    step.answered(first.hold)  # its first token: pullable now, pending TTL more
    assert step.pending.match(CHAIN[:4], computed=True) == {node: 4}
    clock.now += TTL
    assert step.pending.match(CHAIN) == {node: 6}  # turn 2's hold: still waiting
    step.pending.check_invariants()


def test_pending_index_prefix_and_expiry() -> None:
    now = [0.0]
    p = PendingIndex(ttl_s=5.0, clock=lambda: now[0])
    p.add(A, [h(1), h(2), h(3)])
    now[0] = 2.0
    p.add(B, [h(1), h(4)])
    assert p.match([h(1), h(2), h(3), h(9)]) == {A: 3, B: 1}
    assert p.match([h(2)]) == {A: 1}
    now[0] = 5.0  # a's records expire exactly at 5.0
    assert p.match([h(1), h(4)]) == {B: 2}
    p.check_invariants()
    now[0] = 7.0
    assert p.match([h(1)]) == {} and len(p) == 0
    p.check_invariants()


@settings(max_examples=50, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.sampled_from([A, B, C]), st.lists(st.integers(0, 4), max_size=4), st.floats(0, 3)),
        max_size=15,
    ),
    query=st.lists(st.integers(0, 4), min_size=1, max_size=4),
)
def test_pending_index_matches_a_dict_model(
    ops: list[tuple[NodeId, list[int], float]], query: list[int]
) -> None:
    now = [0.0]
    p = PendingIndex(ttl_s=4.0, clock=lambda: now[0])
    model: dict[tuple[int, NodeId], float] = {}
    for node, hs, dt in ops:
        now[0] += dt
        p.add(node, [h(i) for i in hs])
        model.update({(i, node): now[0] + 4.0 for i in hs})
        p.check_invariants()
    expect = {}
    for n in (A, B, C):
        k = 0
        while k < len(query) and model.get((query[k], n), -1.0) > now[0]:
            k += 1
        if k:
            expect[n] = k
    assert p.match([h(i) for i in query]) == expect
    p.check_invariants()
