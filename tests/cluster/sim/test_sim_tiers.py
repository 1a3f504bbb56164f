"""The simulator's host and disk tiers (node.SecondChance): the tiers and their cache events against a
list oracle, hits and read time on hand-computed traces, the index following every tier move and the
prefix-aware policies routing to a tier holder, and gpu-only runs exactly as before the tiers existed.

Timing as in test_sim: 512-token blocks at 512 tokens/s prefill in 1 s; 1 KV byte a token makes a
block 512 bytes, so a host tier at 5120 B/s reads it in 0.1 s and a disk tier at 512 B/s in 1 s.
"""

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from radixmesh.cluster.cli.sim import sim
from radixmesh.cluster.sim.config import SimConfig
from radixmesh.cluster.sim.node import SecondChance
from radixmesh.cluster.sim.simulator import SimReport, SimRequest, Simulator, prepare
from radixmesh.cluster.sim.trace import TraceRequest, read_trace
from radixmesh.common.prefix_cache.prefix_cache import EvictedBlock
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.events import BlockRemoved, BlockStored, CacheEvent, Tier
from radixmesh.proto.ids import BlockId, NodeId

TRACES = Path(__file__).resolve().parents[2] / "data" / "traces"


def trace(rows: Sequence[tuple[float, list[int]]]) -> list[SimRequest]:
    return prepare([TraceRequest(t, 512 * len(ids), 1, tuple(ids)) for t, ids in rows])


def config(capacity: int, host: int = 0, disk: int = 0, nodes: int = 1) -> SimConfig:
    return SimConfig(nodes=nodes, capacity_blocks=capacity, policy="round_robin", prefill_tokens_per_s=512.0,
                     kv_bytes_per_token=1, pull_bytes_per_s=5120.0, pull_latency_s=0.0, candidates=0,
                     cluster_recall=False, handoff=False, check_every=1, host_blocks=host, disk_blocks=disk,
                     host_bytes_per_s=5120.0, disk_bytes_per_s=512.0)


def run(rows: Sequence[tuple[float, list[int]]], c: SimConfig) -> tuple[SimReport, list[float]]:
    s = Simulator(c)
    return s.run(trace(rows)), s.ttfts


def h(i: int) -> BlockHash:
    return BlockHash(i.to_bytes(2, "big"))


class TierOracle:
    """Each tier a plain list, oldest first; the levels with no room skipped."""

    def __init__(self, host: int, disk: int) -> None:
        self.levels: list[tuple[str, list[BlockHash], int]] = [
            (s, [], cap) for s, cap in (("local_host", host), ("local_disk", disk)) if cap]

    def admit(self, hashes: list[BlockHash]) -> None:
        for x in hashes:
            for _, blocks, _ in self.levels:
                if x in blocks:
                    blocks.remove(x)
            for _, blocks, cap in self.levels:
                blocks.append(x)
                if len(blocks) <= cap:
                    break
                x = blocks.pop(0)

    def take(self, hashes: list[BlockHash]) -> dict[str, int]:
        hits: dict[str, int] = {}
        for x in hashes:
            level = next((lv for lv in self.levels if x in lv[1]), None)
            if level is None:
                break
            level[1].remove(x)
            hits[level[0]] = hits.get(level[0], 0) + 1
        return hits


def replay(held: dict[Tier, set[BlockHash]], events: Sequence[CacheEvent]) -> None:
    """Apply tier events strictly: a block is stored only where it is not held, removed only where it is."""
    for e in events:
        assert isinstance(e, BlockStored | BlockRemoved) and e.tier != Tier.GPU, e
        on_tier = held.setdefault(e.tier, set())
        for x in e.hashes:
            if isinstance(e, BlockStored):
                assert x not in on_tier, f"{x.hex()} stored twice on {e.tier}"
                on_tier.add(x)
            else:
                assert x in on_tier, f"{x.hex()} removed from {e.tier}, where it is not"
                on_tier.remove(x)


ops = st.lists(st.tuples(st.booleans(), st.lists(st.integers(0, 9), max_size=6)), max_size=40)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 4), st.integers(0, 4), ops)
def test_second_chance_matches_the_list_oracle(host: int, disk: int, steps: list[tuple[bool, list[int]]]) -> None:
    # Its events, replayed, hold what its tiers hold: what the index learns of them.
    tiers, oracle = SecondChance(host, disk), TierOracle(host, disk)
    held: dict[Tier, set[BlockHash]] = {}
    assert bool(tiers) == bool(host or disk)
    for admit, ids in steps:
        hashes = [h(i) for i in ids]
        if admit:
            tiers.admit([EvictedBlock(BlockId(0), x, None) for x in hashes])
            oracle.admit(hashes)
        else:
            assert tiers.take(hashes) == oracle.take(hashes)
        tiers.check_invariants()
        assert [(s, list(b)) for s, b, _ in tiers.levels] == [(s, b) for s, b, _ in oracle.levels]
        replay(held, tiers.take_events())
        assert {t: b for t, b in held.items() if b} == {
            SecondChance.TIER_OF[s]: set(b) for s, b, _ in oracle.levels if b}


def indexed(s: Simulator, node: str = "n000") -> tuple[set[BlockHash], set[BlockHash]]:
    """The blocks the simulator's index says `node` holds: on its gpu, and in its host or disk tier."""
    chains = s.index.node_chains(NodeId(node))
    gpu = {x for c in chains if c.tier == Tier.GPU for x in c.hashes}
    return gpu, {x for c in chains if c.tier != Tier.GPU for x in c.hashes}


def test_the_index_follows_blocks_down_the_tiers_and_forgets_what_the_disk_drops() -> None:
    # One block each in host and disk under a 2-block gpu: [2, 3] pushes [0, 1] to host and disk,
    # [4, 5] pushes [2, 3] after them, and the disk drops [0, 1].
    rows = [(0, [0, 1]), (10, [2, 3]), (20, [4, 5])]
    hashes = [r.hashes for r in trace(rows)]
    two = Simulator(config(capacity=2, host=1, disk=1))
    two.run(trace(rows[:2]))
    assert indexed(two) == (set(hashes[1]), set(hashes[0]))
    three = Simulator(config(capacity=2, host=1, disk=1))
    three.run(trace(rows))
    assert indexed(three) == (set(hashes[2]), set(hashes[1]))
    assert three.index.node_block_count(NodeId("n000")) == 4


@settings(max_examples=25, deadline=None)
@given(st.lists(st.lists(st.integers(0, 11), min_size=1, max_size=5), min_size=1, max_size=25),
       st.sampled_from(["prefix_affinity", "cost"]), st.integers(0, 4), st.integers(0, 6))
def test_the_index_holds_what_each_node_holds_on_every_tier(prompts: list[list[int]], policy: str,
                                                            host: int, disk: int) -> None:
    # check_every=1 also compares the counts after every arrival (Simulator.check_invariants).
    s = Simulator(dataclasses.replace(config(3, host, disk, nodes=2), policy=policy))
    s.run(trace([(1.5 * i, p) for i, p in enumerate(prompts)]))
    for nid, node in s.nodes.items():
        assert indexed(s, nid) == ({x for x, _ in node.cache.snapshot()}, set(node.tiers.hashes()))


# Node A computes [0, 1] while B takes a long prompt; [2, 3] goes to A (B is busy) and pushes [0, 1]
# into A's tier; [2, 3, 4] follows its prefix to A, which is still busy with it (0.9 s left) when
# [0, 1] comes back. Only A's tier holds [0, 1]: a read of 0.2 s there beats 2 s of prefill on idle B.
TIER_HOLDER = [(0, [0, 1]), (0, list(range(50, 60))), (3, [2, 3]), (19.9, [2, 3, 4]), (20, [0, 1])]


@pytest.mark.parametrize("policy", ["prefix_affinity", "cost_no_pull"])
@pytest.mark.parametrize(("host", "disk", "source"), [(2, 0, "local_host"), (0, 2, "local_disk")])
def test_a_prefix_only_one_tier_holds_is_routed_to_its_node(policy: str, host: int, disk: int, source: str) -> None:
    c = dataclasses.replace(config(2, host, disk, nodes=2), policy=policy, disk_bytes_per_s=5120.0)
    r, ttfts = run(TIER_HOLDER, c)
    assert r.hits_by_source == {"local": 2, "remote": 0, "miss": 15, "local_host": 0, "local_disk": 0, source: 2}
    assert ttfts[-1] == pytest.approx(1.1)


def test_a_prefix_evicted_from_the_gpu_is_read_back_from_the_host() -> None:
    # [0, 1] is evicted by [2, 3] into the host tier and read back in 0.2 s; [2, 3] goes down.
    r, ttfts = run([(0, [0, 1]), (10, [2, 3]), (20, [0, 1])], config(capacity=2, host=2))
    assert r.hits_by_source == {"local": 0, "remote": 0, "miss": 4, "local_host": 2, "local_disk": 0}
    assert r.hit_rate == pytest.approx(2 / 6)
    assert ttfts == [pytest.approx(2.0), pytest.approx(2.0), pytest.approx(0.2)]


def test_the_host_tier_spills_to_disk_and_a_hit_pays_both_reads() -> None:
    # One block each in host and disk: [0, 1] comes back as one host and one disk read (0.1 + 1 s),
    # then recomputes block 2, which the gpu (2 blocks) has no room to keep with 0 and 1: 1 s.
    r, ttfts = run([(0, [0, 1]), (10, [3, 4]), (20, [0, 1, 2])], config(capacity=2, host=1, disk=1))
    assert r.hits_by_source == {"local": 0, "remote": 0, "miss": 5, "local_host": 1, "local_disk": 1}
    assert ttfts[-1] == pytest.approx(2.1)


def test_without_tiers_the_gpu_miss_is_recomputed() -> None:
    r, ttfts = run([(0, [0, 1]), (10, [2, 3]), (20, [0, 1])], config(capacity=2))
    assert r.hits_by_source == {"local": 0, "remote": 0, "miss": 6}
    assert ttfts[-1] == pytest.approx(2.0)


def test_gpu_only_runs_exactly_as_before_the_tiers() -> None:
    # Figures of `up`'s configuration on one node, read from the simulator before tiers were added
    # (one node: runs of several nodes differ with PYTHONHASHSEED, tiers or not).
    requests = prepare(read_trace(TRACES / "chat.jsonl", limit=300))
    r = Simulator(SimConfig(nodes=1, capacity_blocks=30)).run(requests)
    assert r.hits_by_source == {"local": 1477, "remote": 0, "miss": 614}
    assert r.misses_by_cause == {"first": 509, "held": 0, "computing": 0, "evicted": 105}
    assert (r.ttft_p50_s, r.ttft_p99_s) == (pytest.approx(0.0512), pytest.approx(0.1766))


@settings(max_examples=25, deadline=None)
@given(st.lists(st.lists(st.integers(0, 11), min_size=1, max_size=5), min_size=1, max_size=25),
       st.integers(5, 8), st.integers(0, 6), st.integers(0, 12))
def test_on_one_node_tiers_only_turn_misses_into_tier_hits(prompts: list[list[int]], capacity: int,
                                                           host: int, disk: int) -> None:
    # One node's gpu sees the same allocations whether a block is read back or recomputed, so its
    # own hits are unchanged; the tiers can only serve blocks seen before (the infinite bound).
    rows = [(10.0 * i, p) for i, p in enumerate(prompts)]
    gpu, _ = run(rows, config(capacity))
    tiered, _ = run(rows, config(capacity, host, disk))
    tier_hits = sum(tiered.hits_by_source.get(s, 0) for s in SecondChance.SOURCES)
    assert tiered.hits_by_source["local"] == gpu.hits_by_source["local"]
    assert tiered.hits_by_source["miss"] == gpu.hits_by_source["miss"] - tier_hits
    assert sum(tiered.hits_by_source.values()) == tiered.blocks
    assert gpu.hit_rate <= tiered.hit_rate <= tiered.infinite_bound + 1e-12


def test_negative_tiers_and_bandwidths_are_refused() -> None:
    base = config(capacity=2)
    for bad in ({"host_blocks": -1}, {"disk_blocks": -1}, {"host_bytes_per_s": 0.0},
                {"disk_bytes_per_s": float("inf")}):
        with pytest.raises(ValueError):
            dataclasses.replace(base, **bad)  # type: ignore[arg-type]


def test_cli_tier_options() -> None:
    path = str(TRACES / "chat.jsonl")
    out = CliRunner().invoke(sim, [path, "--nodes", "2", "--capacity", "9", "--limit", "100",
                                   "--host-blocks", "36", "--disk-blocks", "180"])
    assert out.exit_code == 0, out.output
    assert "local_host" in out.output and "host tier 36 blocks" in out.output
    bad = CliRunner().invoke(sim, [path, "--host-blocks", "-1"])
    assert bad.exit_code == 2 and "--host-blocks" in bad.output
