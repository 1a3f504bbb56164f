"""Memory metrics: exact snapshot numbers for a known pool state, and a parseable Prometheus text."""

from dataclasses import dataclass

import pytest
from prometheus_client.parser import text_string_to_metric_families

from radixmesh.common.block_pool.block_pool import BlockPool, OutOfBlocks
from radixmesh.common.block_pool.config import PoolConfig
from radixmesh.common.block_pool.counters import seq_len_bucket
from radixmesh.common.metrics.exposition import (
    Histogram,
    HistogramSnapshot,
    metric,
    render_prometheus,
)
from radixmesh.common.prefix_cache.prefix_cache import PrefixCache
from radixmesh.node_agent.memory.metrics import FREE_RUN_BUCKETS, MemoryStats, memory_stats
from radixmesh.proto.block_hash import hash_blocks
from radixmesh.proto.events import Tier
from radixmesh.proto.ids import BlockId

BB = 1024  # block bytes


def known_state() -> PrefixCache:
    """10 blocks: in use 0..3 (0 and 1 pinned twice), cached 4, 5, free 6 and 8, 9; one OOM."""
    cache = PrefixCache(BlockPool(10, block_bytes=BB))
    pool = cache.pool
    held = pool.allocate(10)
    hashes = hash_blocks(list(range(32)), 16)
    cache.insert(hashes, [BlockId(4), BlockId(5)])
    pool.free([BlockId(b) for b in (4, 5, 6, 8, 9)])  # 4, 5 cached; 6, 8, 9 free
    assert cache.match(hashes) == [4, 5]  # query 2 hit 2
    cache.release([BlockId(4), BlockId(5)])
    assert cache.match(hash_blocks(list(range(100, 132)), 16)) == []  # query 2 hit 0
    pool.incref([BlockId(0), BlockId(1)])
    with pytest.raises(OutOfBlocks):
        pool.allocate(9, seq_len=3000)
    pool.record_preemption(2 * BB)
    assert held[7] == 7  # block 7 stays in use, splitting the free blocks into [6] and [8, 9]
    return cache


def test_snapshot_has_exact_numbers() -> None:
    cache = known_state()
    s = memory_stats(cache.pool, cache)
    assert s.tier == "gpu"
    assert s.pool_blocks == {"free": 3, "in_use": 5, "cached": 2}
    assert s.pool_utilization == 0.5
    assert s.free_bytes == 3 * BB and s.largest_free_run_bytes == 2 * BB
    assert s.fragmentation_ratio == pytest.approx(1 - 2 / 3)
    # runs [6] and [8, 9]: one of at most 1 block, both of at most 2 (and of any larger bound)
    assert s.free_runs == {"1": 1, **{str(b): 2 for b in FREE_RUN_BUCKETS[1:]}, "+Inf": 2}
    assert s.oom == {"no_free_block": 1, "no_contiguous_block": 0, "ref_count_lock": 0, "zone_limit": 0}
    assert s.oom_by_seq_len == {"4096": 1}
    assert (s.preemptions, s.swapped_to_host_bytes) == (1, 2 * BB)
    assert (s.prefix_query_blocks, s.prefix_hit_blocks) == (4, 2)
    # GAIE's KV-cache utilisation: blocks held by requests over all of them; the cached ones are free
    assert s.kv_cache_usage_perc == s.gpu_cache_usage_perc == 0.5
    assert s.pool_mean_refcount == pytest.approx(7 / 5)  # refs 2, 2, 1, 1, 1
    assert s.ghost_block_bytes == 0 and s.evictions == 0 and s.gc_runs == 0
    assert s.gc_auto_runs == 0 and s.gc_trigger_free_run_bytes == 0


def test_gc_trigger_is_exported_in_bytes() -> None:
    pool = BlockPool(10, block_bytes=BB, config=PoolConfig(gc_trigger_free_run_bytes=3 * BB - 1))
    assert memory_stats(pool).gc_trigger_free_run_bytes == 3 * BB


def test_prometheus_text_parses_with_radixmesh_names_and_tier_labels() -> None:
    cache = known_state()
    host = BlockPool(4, tier=Tier.HOST, block_bytes=BB)
    text = render_prometheus([memory_stats(cache.pool, cache), memory_stats(host)])
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families and all(name.startswith(("radixmesh_", "vllm:")) for name in families)
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples
    }
    assert samples[("radixmesh_oom_total", (("reason", "no_free_block"), ("tier", "gpu")))] == 1
    assert samples[("radixmesh_oom_by_seq_len_total", (("seq_len_le", "4096"), ("tier", "gpu")))] == 1
    assert samples[("radixmesh_pool_blocks", (("state", "free"), ("tier", "host")))] == 4
    assert samples[("radixmesh_largest_free_run_bytes", (("tier", "gpu"),))] == 2 * BB
    assert samples[("radixmesh_free_runs", (("size_le", "1"), ("tier", "gpu")))] == 1
    assert samples[("radixmesh_free_runs", (("size_le", "+Inf"), ("tier", "gpu")))] == 2
    assert families["radixmesh_free_runs"].type == "gauge"  # a distribution now, not since start
    assert samples[("radixmesh_prefix_hit_blocks_total", (("tier", "gpu"),))] == 2
    assert samples[("radixmesh_prefix_query_blocks_total", (("tier", "gpu"),))] == 4
    assert "radixmesh_prefix_hit_rate" not in families  # a lifetime ratio: dashboards rate() the counters
    # the gpu tier alone is the KV cache an endpoint picker reads: one series
    assert [s.labels for s in families["vllm:kv_cache_usage_perc"].samples] == [{"tier": "gpu"}]
    assert samples[("radixmesh_swapped_to_host_bytes_total", (("tier", "gpu"),))] == 2 * BB
    assert families["radixmesh_evictions"].type == "counter"
    assert families["radixmesh_ghost_block_bytes"].type == "gauge"
    # every metric DESIGN.md lists for memory is present
    for name in (
        "pool_utilization", "free_runs", "largest_free_run_bytes", "fragmentation_ratio", "oom",
        "oom_by_seq_len", "preemptions", "swapped_to_host_bytes", "prefix_hit_blocks", "pool_mean_refcount",
        "ghost_block_bytes", "evictions",
    ):  # fmt: skip
        assert "radixmesh_" + name in families, name


def test_another_stats_dataclass_joins_the_rendering() -> None:
    @dataclass(frozen=True, slots=True)
    class EngineStats:
        node: str
        prefill_seconds: float = metric("counter", "Time spent in prefill.")

    text = render_prometheus([EngineStats("n1", 1.5), memory_stats(BlockPool(2))])
    assert 'radixmesh_prefill_seconds_total{node="n1"} 1.5' in text
    assert 'radixmesh_pool_utilization{tier="gpu"} 0.0' in text


def test_several_labels_fill_from_tuple_keys() -> None:
    @dataclass(frozen=True, slots=True)
    class PullStats:
        node: str
        pulls: dict[tuple[str, str], int] = metric(  # noqa: RUF009  (metadata only, no default)
            "counter", "Pulls by outcome.", "peer", "outcome")

    text = render_prometheus([PullStats("a", {("b", "ok"): 3, ("c", "timeout"): 1})])
    assert 'radixmesh_pulls_total{node="a",outcome="ok",peer="b"} 3.0' in text
    assert 'radixmesh_pulls_total{node="a",outcome="timeout",peer="c"} 1.0' in text


def test_histogram_renders_cumulative_buckets_sum_and_count() -> None:
    @dataclass(frozen=True, slots=True)
    class Timings:
        wait_seconds: HistogramSnapshot = metric("histogram", "Time waited.")  # noqa: RUF009

    h = Histogram((0.1, 1.0))
    for v in (0.05, 0.1, 0.5, 3.0):  # 0.1 falls in le="0.1": Prometheus buckets are "less or equal"
        h.observe(v)
    families = {f.name: f for f in text_string_to_metric_families(render_prometheus([Timings(h.snapshot())]))}
    family = families["radixmesh_wait_seconds"]
    assert family.type == "histogram"
    samples = {(s.name, s.labels.get("le")): s.value for s in family.samples}
    assert samples == {
        ("radixmesh_wait_seconds_bucket", "0.1"): 2, ("radixmesh_wait_seconds_bucket", "1.0"): 3,
        ("radixmesh_wait_seconds_bucket", "+Inf"): 4, ("radixmesh_wait_seconds_count", None): 4,
        ("radixmesh_wait_seconds_sum", None): pytest.approx(3.65),
    }  # fmt: skip


def test_histogram_bounds_must_ascend() -> None:
    with pytest.raises(ValueError):
        Histogram((1.0, 0.5))
    with pytest.raises(ValueError):
        Histogram((1.0, float("inf")))


def test_seq_len_buckets() -> None:
    assert [seq_len_bucket(n) for n in (1, 256, 257, 16384, 16385, None)] == [
        "256", "256", "512", "16384", "+Inf", "unknown",
    ]  # fmt: skip
    assert MemoryStats.__dataclass_params__.frozen  # type: ignore[attr-defined]
