"""Where partitioned memory loses to one pooled cache: eviction counts and ages by kind
(`SimReport.evictions`), and what load balance alone allows (`radixmesh.cluster.sim.balance`).

Timing as in test_sim.py: 512 tokens/s and 512-token trace blocks make prefill 1 s a block.
"""

from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from radixmesh.cluster.sim.balance import offline_max_over_mean, online_max_over_mean
from radixmesh.cluster.sim.config import SimConfig
from radixmesh.cluster.sim.eviction_ages import EvictionSummary
from radixmesh.cluster.sim.simulator import SimReport, Simulator, prepare
from radixmesh.cluster.sim.trace import TraceRequest


def run(rows: Sequence[tuple[float, list[int]]], nodes: int, capacity: int) -> SimReport:
    # Round robin over every node (candidates=0): the cases below count on its strict alternation.
    config = SimConfig(nodes=nodes, capacity_blocks=capacity, policy="round_robin", prefill_tokens_per_s=512.0,
                       kv_bytes_per_token=1, pull_bytes_per_s=5120.0, pull_latency_s=0.0, candidates=0,
                       check_every=1)
    return Simulator(config).run(prepare([TraceRequest(t, 512 * len(ids), 1, tuple(ids)) for t, ids in rows]))


def test_one_node_evicts_last_copies_as_global_lru_does() -> None:
    r = run([(0, [0, 1]), (10, [2, 3])], nodes=1, capacity=2)
    assert r.evictions == {"last_copy": EvictionSummary(2, 10.0), "global_lru": EvictionSummary(2, 10.0)}


def test_a_duplicate_eviction_is_told_from_a_last_copy() -> None:
    # round robin: the repeat at 10 s lands on the other node (two copies of 0, 1); at 20 s node 0
    # evicts its copy (a duplicate, last used at 10 s), at 30 s node 1 evicts the last one. Global
    # LRU (4 blocks) keeps both blocks until the fourth request.
    r = run([(0, [0, 1]), (10, [0, 1]), (20, [2, 3]), (30, [4, 5])], nodes=2, capacity=2)
    assert r.evictions == {
        "last_copy": EvictionSummary(2, 20.0),
        "duplicate": EvictionSummary(2, 10.0),
        "global_lru": EvictionSummary(2, 20.0),
    }
    assert r.as_dict()["evictions"]["duplicate"] == {"blocks": 2, "age_p50_s": 10.0}  # type: ignore[index]


def test_no_eviction_reports_none() -> None:
    assert run([(0, [0, 1]), (10, [0, 2])], nodes=1, capacity=8).evictions == {}


def test_balance_online_and_offline() -> None:
    # online: 1, 1 on the two nodes, then 2 tops one of them (3 vs a mean of 2); offline: 2 first
    assert online_max_over_mean([1, 1, 2], 2) == pytest.approx(1.5)
    assert offline_max_over_mean([1, 1, 2], 2) == pytest.approx(1.0)
    assert online_max_over_mean([], 3) == 0.0
    with pytest.raises(ValueError, match="nodes"):
        online_max_over_mean([1], 0)


@given(st.lists(st.integers(1, 1000), min_size=1, max_size=60), st.integers(1, 8))
def test_greedy_balance_stays_within_grahams_bound(tokens: list[int], nodes: int) -> None:
    # A greedy placement is never worse than the mean plus the largest request (Graham).
    mean = sum(tokens) / nodes
    for f in (online_max_over_mean, offline_max_over_mean):
        got = f(tokens, nodes)
        assert max(1.0, max(tokens) / mean) - 1e-9 <= got <= 1 + max(tokens) / mean + 1e-9
