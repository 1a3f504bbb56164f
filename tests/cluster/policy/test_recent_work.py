"""RecentWork, the decayed work measure bounded load uses: exact decay on an injected clock, a
property test against a sum-over-history oracle, and bad input that changes nothing."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixmesh.cluster.policy.recent_work import RecentWork
from radixmesh.proto.ids import NodeId

A, B = NodeId("a"), NodeId("b")


def test_work_halves_every_half_life() -> None:
    now = [0.0]
    r = RecentWork(10.0, lambda: now[0])
    r.add(A, 800.0)
    now[0] = 10.0
    assert r.value(A) == pytest.approx(400.0)
    r.add(A, 100.0)
    now[0] = 30.0
    assert r.value(A) == pytest.approx(125.0)  # (400 + 100) / 4
    assert r.value(B) == 0.0
    r.check_invariants()


def test_a_clock_stepping_back_does_not_grow_the_value() -> None:
    now = [5.0]
    r = RecentWork(1.0, lambda: now[0])
    r.add(A, 8.0)
    now[0] = 4.0
    assert r.value(A) == 8.0


@pytest.mark.parametrize("work", [-1.0, float("nan"), float("inf")])
def test_bad_work_raises_and_changes_nothing(work: float) -> None:
    r = RecentWork(10.0, lambda: 0.0)
    r.add(A, 3.0)
    with pytest.raises(ValueError, match="work"):
        r.add(A, work)
    assert r.value(A) == 3.0
    r.check_invariants()


@pytest.mark.parametrize("half_life", [0.0, -1.0, float("inf"), float("nan")])
def test_bad_half_life_raises(half_life: float) -> None:
    with pytest.raises(ValueError, match="half_life_s"):
        RecentWork(half_life, lambda: 0.0)


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(st.tuples(st.sampled_from([A, B]), st.one_of(st.floats(0, 1000), st.none()), st.floats(0, 30)),
                 max_size=20),
    half_life=st.sampled_from([1.0, 7.5, 60.0]),
)
def test_matches_a_sum_over_history(ops: list[tuple[NodeId, float | None, float]], half_life: float) -> None:
    """Work None: the node left (forget); the oracle drops its history."""
    now = [0.0]
    r = RecentWork(half_life, lambda: now[0])
    history: list[tuple[NodeId, float, float]] = []
    for node, work, dt in ops:
        now[0] += dt
        if work is None:
            r.forget(node)
            history = [h for h in history if h[0] != node]
        else:
            r.add(node, work)
            history.append((node, work, now[0]))
        r.check_invariants()
        values = {}
        for n in (A, B):
            values[n] = sum(w * 2.0 ** (-(now[0] - t) / half_life) for m, w, t in history if m == n)
            assert r.value(n) == pytest.approx(values[n], rel=1e-9, abs=1e-9)
        assert r.total() == pytest.approx(sum(values.values()), rel=1e-9, abs=1e-6)
        # Least work first; a node with no history (never routed, or forgotten) before any other.
        ranked = r.least(2, [A, B], lambda _: True)
        fresh = sorted(n for n in (A, B) if not any(m == n for m, _, _ in history))
        assert ranked[:len(fresh)] == fresh
        if not fresh:
            assert values[ranked[0]] <= values[ranked[1]] * (1 + 1e-9) + 1e-9


def test_a_node_that_left_comes_back_as_the_least_loaded() -> None:
    now = [0.0]
    r = RecentWork(150.0, lambda: now[0])
    r.add(A, 190_000.0)
    r.add(B, 20_000.0)
    assert r.least(1, [A, B], lambda _: True) == [B]
    r.forget(A)
    assert r.value(A) == 0.0 and r.total() == pytest.approx(20_000.0)
    assert r.least(1, [A, B], lambda _: True) == [A]
    r.forget(NodeId("never-seen"))  # nothing to drop
    r.check_invariants()
