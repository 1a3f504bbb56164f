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
    ops=st.lists(st.tuples(st.sampled_from([A, B]), st.floats(0, 1000), st.floats(0, 30)), max_size=20),
    half_life=st.sampled_from([1.0, 7.5, 60.0]),
)
def test_matches_a_sum_over_history(ops: list[tuple[NodeId, float, float]], half_life: float) -> None:
    now = [0.0]
    r = RecentWork(half_life, lambda: now[0])
    history: list[tuple[NodeId, float, float]] = []
    for node, work, dt in ops:
        now[0] += dt
        r.add(node, work)
        history.append((node, work, now[0]))
        r.check_invariants()
        for n in (A, B):
            expect = sum(w * 2.0 ** (-(now[0] - t) / half_life) for m, w, t in history if m == n)
            assert r.value(n) == pytest.approx(expect, rel=1e-9, abs=1e-9)
