"""Memory metrics: the frozen snapshot of one tier (its pool and prefix cache), rendered to
Prometheus by common.metrics.exposition.render_prometheus, labelled `tier`. The gpu tier's also
carries the KV-cache utilisation of the Gateway API Inference Extension's model-server protocol.

The prefix hit rate is no gauge: a lifetime ratio hides the last minutes behind everything since
start. Dashboards divide the counters' rates (prefix_hit_blocks_total over prefix_query_blocks_total)."""

# metric() returns a dataclasses.field (metadata only), which RUF009 takes for a mutable default.
# ruff: noqa: RUF009

from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass

from radixmesh.common.block_pool.block_pool import BlockPool
from radixmesh.common.metrics.exposition import metric
from radixmesh.common.prefix_cache.prefix_cache import PrefixCache
from radixmesh.proto.events import Tier

FREE_RUN_BUCKETS = tuple(2**i for i in range(15))
"""Bounds (blocks) of the free-run size distribution: the `size_le` values of radixmesh_free_runs."""


@dataclass(frozen=True, slots=True)
class MemoryStats:
    """Every memory metric of one tier's pool (and its prefix cache), at one instant."""

    tier: str
    pool_blocks: dict[str, int] = metric("gauge", "Blocks by state (free, in_use, cached).", "state")
    pool_utilization: float = metric("gauge", "Fraction of blocks in use (ref > 0).")
    # Not a histogram: a histogram counts observations since start, its buckets only grow, and
    # rate() over them is what it is for. The free runs are a distribution at this instant (they
    # merge and split as blocks are freed and taken), so they are gauges, cumulative like `le`.
    free_runs: dict[str, int] = metric(
        "gauge", "Maximal runs of free blocks now, of at most size_le blocks each (cumulative).", "size_le"
    )
    free_bytes: int = metric("gauge", "Bytes in free blocks.")
    largest_free_run_bytes: int = metric("gauge", "Bytes in the longest run of consecutive free blocks.")
    fragmentation_ratio: float = metric("gauge", "1 - largest free run / free blocks (0 if none is free).")
    oom: dict[str, int] = metric("counter", "Allocations refused, by reason.", "reason")
    oom_by_seq_len: dict[str, int] = metric(
        "counter", "Allocations refused, by sequence length bucket (tokens, upper bound).", "seq_len_le"
    )
    preemptions: int = metric("counter", "Sequences preempted to make room.")
    swapped_to_host_bytes: int = metric("counter", "Bytes of KV moved to the host tier by preemption.")
    prefix_query_blocks: int = metric("counter", "Blocks looked up by prefix matches.")
    prefix_hit_blocks: int = metric("counter", "Blocks found cached by prefix matches.")
    pool_mean_refcount: float = metric("gauge", "Mean refcount of the blocks in use (0 if none is).")
    ghost_block_bytes: int = metric("gauge", "Bytes in blocks at ref 0 that are neither free nor evictable.")
    evictions: int = metric("counter", "Cached blocks evicted.")
    gc_runs: int = metric("counter", "Two-phase GC passes.")
    gc_auto_runs: int = metric(
        "counter", "GC passes started automatically because the largest free run fell under the trigger.")
    gc_trigger_free_run_bytes: int = metric(
        "gauge", "Automatic GC runs when the largest free run is shorter than this many bytes (0: off).")
    # GAIE's KVCacheUtilization, as vLLM defines it: blocks referenced by requests over all blocks,
    # cached blocks nobody references counting as free (they are evictable). The gpu tier only (None
    # elsewhere: no sample: an endpoint picker takes one series per family). Under both of vLLM's
    # names: GAIE's endpoint picker defaults to kv_cache_usage_perc, its releases and scrapers written
    # before vLLM's rename read gpu_cache_usage_perc.
    kv_cache_usage_perc: float | None = metric(
        "gauge", "GAIE KVCacheUtilization: gpu KV blocks in use by requests / all gpu KV blocks (0..1).",
        name="vllm:kv_cache_usage_perc")
    gpu_cache_usage_perc: float | None = metric(
        "gauge", "vllm:kv_cache_usage_perc under its older name (0..1).", name="vllm:gpu_cache_usage_perc")


def free_runs_by_size(sizes: Iterable[int]) -> dict[str, int]:
    """Runs of at most each FREE_RUN_BUCKETS size (cumulative), then "+Inf": all of them."""
    ordered = sorted(sizes)
    runs = {str(b): bisect_right(ordered, b) for b in FREE_RUN_BUCKETS}
    runs["+Inf"] = len(ordered)
    return runs


def memory_stats(pool: BlockPool, cache: PrefixCache | None = None) -> MemoryStats:
    """Snapshot of `pool` (and the hit counters of `cache`); O(num_blocks)."""
    refs = pool.ref_counts()
    in_use = [r for r in refs if r > 0]
    free = pool.num_free
    largest = pool.largest_free_run()
    c = pool.counters
    usage = pool.num_in_use / pool.num_blocks if pool.tier is Tier.GPU else None
    queries = cache.query_blocks if cache is not None else 0
    hits = cache.hit_blocks if cache is not None else 0
    return MemoryStats(
        tier=str(pool.tier),
        pool_blocks={"free": free, "in_use": pool.num_in_use, "cached": pool.num_cached},
        pool_utilization=pool.num_in_use / pool.num_blocks,
        free_runs=free_runs_by_size(pool.free_run_sizes()),
        free_bytes=free * pool.block_bytes,
        largest_free_run_bytes=largest * pool.block_bytes,
        fragmentation_ratio=1.0 - largest / free if free else 0.0,
        oom={
            r: c.oom_by_reason.get(r, 0) for r in ("no_free_block", "no_contiguous_block", "ref_count_lock", "zone_limit")
        },
        oom_by_seq_len=dict(c.oom_by_seq_len),
        preemptions=c.preemptions,
        swapped_to_host_bytes=c.swapped_to_host_bytes,
        prefix_query_blocks=queries,
        prefix_hit_blocks=hits,
        pool_mean_refcount=sum(in_use) / len(in_use) if in_use else 0.0,
        ghost_block_bytes=pool.ghost_blocks() * pool.block_bytes,
        evictions=c.evictions,
        gc_runs=c.gc_runs,
        gc_auto_runs=c.gc_auto_runs,
        gc_trigger_free_run_bytes=pool.gc_trigger_blocks * pool.block_bytes,
        kv_cache_usage_perc=usage,
        gpu_cache_usage_perc=usage,
    )

