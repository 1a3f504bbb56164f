"""The simulator on hand-computed traces: exact hit counts, TTFTs, oracles and the CLI.

Timing in these tests: 512 tokens/s and 512-token trace blocks make prefill 1 s a block; 1 KV byte
a token at 5120 B/s makes a pull 0.1 s a block.
"""

import json
from collections.abc import Sequence
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from radixmesh.cluster.cli.sim import sim
from radixmesh.cluster.policy.base import RouteDecision
from radixmesh.cluster.sim.config import SimConfig
from radixmesh.cluster.sim.node import SimJob, SimNode
from radixmesh.cluster.sim.simulator import SimReport, SimRequest, Simulator, percentile, prepare
from radixmesh.cluster.sim.trace import TRACE_BLOCK_TOKENS, TraceRequest
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.ids import NodeId


def trace(rows: Sequence[tuple[float, list[int]]]) -> list[SimRequest]:
    return prepare([TraceRequest(t, 512 * len(ids), 1, tuple(ids)) for t, ids in rows])


def simulator(nodes: int, capacity: int, policy: str) -> Simulator:
    """The routings below are computed by hand with every node scored and plain caches (no recall,
    no hand-off), whatever `up` runs by default."""
    config = SimConfig(
        nodes=nodes,
        capacity_blocks=capacity,
        policy=policy,
        prefill_tokens_per_s=512.0,
        kv_bytes_per_token=1,
        pull_bytes_per_s=5120.0,
        pull_latency_s=0.0,
        candidates=0,
        cluster_recall=False,
        handoff=False,
        check_every=1,
    )
    return Simulator(config)


def run(rows: Sequence[tuple[float, list[int]]], nodes: int, capacity: int, policy: str) -> SimReport:
    return simulator(nodes, capacity, policy).run(trace(rows))


def test_one_node_reuses_a_shared_prefix() -> None:
    r = run([(0, [0, 1, 2]), (10, [0, 1, 3]), (20, [4])], nodes=1, capacity=10, policy="round_robin")
    assert r.hits_by_source == {"local": 2, "remote": 0, "miss": 5}
    assert r.hit_rate == pytest.approx(2 / 7)
    assert r.infinite_bound == pytest.approx(2 / 7) and r.global_lru == pytest.approx(2 / 7)
    assert (r.ttft_p50_s, r.ttft_p99_s) == (pytest.approx(1.0), pytest.approx(3.0))


def test_queued_sibling_starts_after_the_prefix_is_cached() -> None:
    r = run([(0, [0, 1]), (0, [0, 1, 2])], nodes=1, capacity=10, policy="round_robin")
    # first: 2 s; second waits 2 s, then reuses 2 blocks and computes 1: TTFT 3 s
    assert r.hits_by_source == {"local": 2, "remote": 0, "miss": 3}
    assert (r.ttft_p50_s, r.ttft_p99_s) == (pytest.approx(2.0), pytest.approx(3.0))


def test_capacity_limits_hits_like_the_global_lru() -> None:
    r = run([(0, [0, 1, 2]), (10, [3, 4]), (20, [3, 4])], nodes=1, capacity=3, policy="cost")
    assert r.hits_by_source == {"local": 2, "remote": 0, "miss": 5}
    assert r.global_lru == pytest.approx(2 / 7)


def test_pending_holder_co_locates_a_burst() -> None:
    # 40 one-block requests first, so the burst is a small part of each node's recent work and
    # bounded load lets the holder take both siblings.
    rows = [(float(i), [100 + i]) for i in range(40)] + [(60.0, [0, 1, 2, 3]), (60.0, [0, 1, 2, 4])]
    affinity = run(rows, nodes=2, capacity=60, policy="prefix_affinity")
    # the sibling follows the pending holder, waits 4 s, reuses 3 blocks: TTFT 5 s
    assert affinity.hits_by_source == {"local": 3, "remote": 0, "miss": 45}
    assert affinity.ttft_p99_s == pytest.approx(5.0)
    assert run(rows, nodes=2, capacity=60, policy="least_loaded").hits_by_source["local"] == 0


def test_cost_sends_a_sibling_to_the_node_computing_its_prefix_not_a_pull_from_it() -> None:
    # The burst of test_pending_holder_co_locates_a_burst under the cost policy. The sibling could
    # go to the idle node and pull the 3 blocks the holder has only just started computing (priced
    # 0.3 s, it would get none of them and recompute); or prefill them a second time there (4 s plus
    # 3 s of duplicate work). It follows the holder instead: 4 s of queue, 1 block, TTFT 5 s.
    rows = [(float(i), [100 + i]) for i in range(40)] + [(60.0, [0, 1, 2, 3]), (60.0, [0, 1, 2, 4])]
    r = run(rows, nodes=2, capacity=60, policy="cost")
    assert r.hits_by_source == {"local": 3, "remote": 0, "miss": 45}
    assert r.ttft_p99_s == pytest.approx(5.0)


def test_bounded_load_splits_a_burst_larger_than_a_fair_share() -> None:
    # On a cold cluster two siblings are the whole recent work: the second may not double the holder's.
    rows = [(0, [0, 1, 2, 3]), (0, [0, 1, 2, 4])]
    r = run(rows, nodes=2, capacity=10, policy="prefix_affinity")
    assert r.hits_by_source == {"local": 0, "remote": 0, "miss": 8} and r.max_load_over_mean == 1.0


def test_misses_are_counted_by_cause() -> None:
    def causes(rows: Sequence[tuple[float, list[int]]], nodes: int, capacity: int, policy: str) -> list[int]:
        m = run(rows, nodes, capacity, policy).misses_by_cause
        return [m["first"], m["held"], m["computing"], m["evicted"]]

    # the burst's second sibling goes to the idle node while the first computes blocks 0-2 there
    assert causes([(0, [0, 1, 2, 3]), (0, [0, 1, 2, 4])], 2, 10, "prefix_affinity") == [5, 0, 3, 0]
    # block 0 left the only (one-block) cache for block 1, then came back
    assert causes([(0, [0]), (10, [1]), (20, [0])], 1, 1, "round_robin") == [2, 0, 0, 1]
    # round robin sends the repeat to the node that lacks it: the other node holds it, not pulled
    assert causes([(0, [0, 1]), (10, [0, 1])], 2, 10, "round_robin") == [2, 2, 0, 0]


def test_cost_pulls_from_a_busy_holder() -> None:
    rows = [(0, [0, 1, 2, 3, 4]), (5, [0, 1, 2, 3, 4, *range(30, 40)]), (6, [0, 1, 2, 3, 4, 50])]
    s = simulator(nodes=2, capacity=20, policy="cost")
    r = s.run(trace(rows))
    # r2 (7680 tokens) would overshoot the holder's work share (cap 1.25 x (2502 + 7680) / 2), so it
    # goes to the other node and pulls 5 blocks: 0.5 s + 10 s; r3 finds the holder idle and within
    # its share: 5 local blocks, 1 s.
    assert r.hits_by_source == {"local": 5, "remote": 5, "miss": 16}
    assert sorted(s.ttfts) == [pytest.approx(1.0), pytest.approx(5.0), pytest.approx(10.5)]
    no_pull = run(rows, nodes=2, capacity=20, policy="cost_no_pull")
    assert no_pull.hits_by_source["remote"] == 0


def test_bounded_load_spreads_sparse_requests_for_one_hot_prefix_by_the_work_they_bring() -> None:
    # Each request ends (3 s) long before the next arrives (10 s), so none is ever in flight at a
    # routing: only the recent-work measure sees what the holder took. With a fresh tail each
    # request computes a block wherever it goes: the work spreads within the cap (eps 0.25), the
    # other node pulling the hot prefix once.
    fresh_tails = run([(10.0 * i, [0, 1, 2, 100 + i]) for i in range(8)], nodes=2, capacity=30, policy="cost")
    assert fresh_tails.max_tokens_over_mean <= 1.25 and fresh_tails.max_computed_over_mean <= 1.25
    assert fresh_tails.hits_by_source == {"local": 18, "remote": 3, "miss": 3 + 8}
    # Wholly cached, they bring no prefill work: the holder keeps most of them (before, counted at
    # their prompt's size, they were sent away to pull what the holder had).
    cached = run([(10.0 * i, [0, 1, 2]) for i in range(8)], nodes=2, capacity=30, policy="cost")
    assert cached.max_load_over_mean > 1.25 and cached.hits_by_source["remote"] <= 3


def test_the_work_each_node_computed_adds_up_to_the_prompt_tokens_nobody_reused() -> None:
    """max_computed_over_mean reads the tokens each node prefilled: over the nodes they add up to the
    prompt tokens less every reused block's, and the report reads the busiest over their mean."""
    rows = [(10.0 * i, [0, 1, 2, 100 + i]) for i in range(6)] + [(70.0, [0, 1, 2])]
    s = simulator(nodes=2, capacity=30, policy="cost")
    r = s.run(trace(rows))
    computed = [n.computed_tokens for n in s.nodes.values()]
    reused = r.hits_by_source["local"] + r.hits_by_source["remote"]
    assert sum(computed) == sum(n.routed_tokens for n in s.nodes.values()) - reused * TRACE_BLOCK_TOKENS
    assert r.max_computed_over_mean == pytest.approx(max(computed) / (sum(computed) / 2))


requests_st = st.lists(
    st.tuples(st.floats(0, 5), st.lists(st.integers(0, 6), min_size=1, max_size=6)), min_size=1, max_size=12
).map(lambda rows: sorted(rows, key=lambda r: r[0]))


@settings(max_examples=25, deadline=None)
@given(
    rows=requests_st,
    nodes=st.integers(1, 3),
    capacity=st.integers(6, 12),
    policy=st.sampled_from(["round_robin", "prefix_affinity", "cost"]),
)
def test_hits_add_up_and_never_beat_the_bound(
    rows: list[tuple[float, list[int]]], nodes: int, capacity: int, policy: str
) -> None:
    r = run(rows, nodes=nodes, capacity=capacity, policy=policy)
    assert sum(r.hits_by_source.values()) == r.blocks == sum(len(ids) for _, ids in rows)
    assert r.hit_rate <= r.infinite_bound + 1e-12
    assert r.global_lru <= r.infinite_bound + 1e-12
    assert r.requests == len(rows)


def test_percentile_nearest_rank() -> None:
    assert percentile([3.0, 1.0, 2.0, 4.0], 50) == 2.0
    assert percentile([3.0, 1.0, 2.0, 4.0], 99) == 4.0
    assert percentile([], 50) == 0.0


def test_sim_config_validates() -> None:
    with pytest.raises(ValueError, match="nodes"):
        SimConfig(nodes=0, capacity_blocks=1)
    with pytest.raises(ValueError, match="unknown policy"):
        Simulator(SimConfig(nodes=1, capacity_blocks=1, policy="nope"))
    with pytest.raises(ValueError, match="candidates and eviction_window must be >= 0, got -1, 64"):
        SimConfig(nodes=1, capacity_blocks=1, candidates=-1, eviction_window=64)
    with pytest.raises(ValueError, match="pending_ttl_s"):
        SimConfig(nodes=1, capacity_blocks=1, pending_ttl_s=0.0)
    with pytest.raises(ValueError, match="load_floor_s"):  # the routers' PolicyConfig, checked up front
        SimConfig(nodes=1, capacity_blocks=1, load_floor_s=-1.0)


def _trace_file(tmp_path: Path) -> Path:
    p = tmp_path / "t.jsonl"
    rows = [(0, [0, 1, 2]), (100, [0, 1, 3]), (200, [0, 1, 2])]
    p.write_text(
        "".join(
            json.dumps({"timestamp": t, "input_length": 512 * len(ids), "output_length": 1, "hash_ids": ids})
            + "\n"
            for t, ids in rows
        )
    )
    return p


def test_cli_json_is_one_object_with_the_contract_keys(tmp_path: Path) -> None:
    out = CliRunner().invoke(sim, [str(_trace_file(tmp_path)), "--nodes", "2", "--capacity", "8", "--json"])
    assert out.exit_code == 0, out.output
    d = json.loads(out.output)
    for key in (
        "hit_rate",
        "hits_by_source",
        "max_load_over_mean",
        "max_tokens_over_mean",
        "max_computed_over_mean",
        "infinite_bound",
        "global_lru",
    ):
        assert key in d
    assert d["blocks"] == 9 and d["infinite_bound"] == pytest.approx(5 / 9)
    assert d["achieved_over_bound"] == pytest.approx(d["hit_rate"] / d["infinite_bound"])


def test_cli_table_and_bad_input(tmp_path: Path) -> None:
    path = str(_trace_file(tmp_path))
    out = CliRunner().invoke(sim, [path, "--nodes", "1", "--capacity", "8", "--policy", "round_robin"])
    assert out.exit_code == 0 and "achieved/bound 1.000" in out.output
    bad = CliRunner().invoke(sim, [path, "--policy", "random"])
    assert bad.exit_code == 2 and "random" in bad.output
    bad = CliRunner().invoke(sim, [path, "--speedup", "0"])
    assert bad.exit_code == 2 and "speedup" in bad.output


def test_a_peer_still_prefilling_offers_the_blocks_finished_so_far() -> None:
    """SimNode.done_prefix: the local prefix at once, pulled blocks once the pull ends, then one
    block per block_tokens prefilled, never more than the job allocated; nothing when idle."""
    node = SimNode(NodeId("a"), capacity_blocks=16, prefill_tokens_per_s=100.0)
    hashes = tuple(BlockHash(bytes([i]) * 16) for i in range(1, 7))
    assert node.done_prefix(0.0, 10) == ()
    node.cache.insert(hashes[:1], node.cache.pool.allocate(1), None)
    node.cache.release(node.cache.match(hashes[:1]))
    decision = RouteDecision(NodeId("a"), 1, NodeId("b"), 2, 0.0, "test")
    node.enqueue(SimJob(0, 0.0, 60, hashes, decision, 30))
    job = node.start_next(peer_prefix=3)
    assert (job.local_blocks, job.pull_blocks, len(job.new_ids)) == (1, 2, 5)
    node.compute_from = 1.0  # the pull of 2 blocks ends at t = 1
    assert node.done_prefix(0.5, 10) == hashes[:1]
    assert node.done_prefix(1.0, 10) == hashes[:3]
    assert node.done_prefix(1.15, 10) == hashes[:4]  # 15 tokens prefilled: one whole block
    assert node.done_prefix(9.0, 10) == hashes  # capped at what the job holds
    node.finish()
    assert node.done_prefix(9.0, 10) == ()
