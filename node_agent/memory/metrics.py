"""Memory metrics: live counters, a frozen snapshot of one tier, and the one Prometheus rendering.

Any frozen stats dataclass joins the rendering by declaring its metric fields with `metric(...)`:
each such field becomes ``radixmesh_<field name>`` (counters gain ``_total``), and its plain
``str`` fields become labels on every sample. The engine's stats will join the same way.
"""

# metric() returns a dataclasses.field (metadata only), which RUF009 takes for a mutable default.
# ruff: noqa: RUF009

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from radixmesh.node_agent.memory.block_pool import BlockPool
from radixmesh.node_agent.memory.prefix_cache import PrefixCache

PREFIX = "radixmesh_"
FREE_RUN_BUCKETS = tuple(2**i for i in range(15))
"""Histogram bounds (blocks) of the free-run size distribution."""


MetricKind = Literal["gauge", "counter", "histogram"]


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """How one stats field renders: kind, help text, and the label its dict keys fill (if a dict)."""

    kind: MetricKind
    help: str
    label: str | None = None


def metric(kind: MetricKind, help: str, label: str | None = None) -> Any:
    """A dataclass field (no default) declaring a stats field a metric. A dict value needs `label`
    (its keys fill it); a histogram's value is ``(cumulative (le, count) buckets ending with "+Inf",
    sum)``."""
    return field(metadata={"metric": MetricSpec(kind, help, label)})


@dataclass(frozen=True, slots=True)
class MemoryStats:
    """Every memory metric of one tier's pool (and its prefix cache), at one instant."""

    tier: str
    pool_blocks: dict[str, int] = metric("gauge", "Blocks by state (free, in_use, cached).", "state")
    pool_utilization: float = metric("gauge", "Fraction of blocks in use (ref > 0).")
    free_run_size_blocks: tuple[list[tuple[str, int]], int] = metric(
        "histogram", "Length in blocks of each maximal run of free blocks."
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
    prefix_hit_rate: float = metric("gauge", "prefix_hit_blocks / prefix_query_blocks (0 before any query).")
    avg_ref_count: float = metric("gauge", "Mean refcount of the blocks in use.")
    ghost_block_bytes: int = metric("gauge", "Bytes in blocks at ref 0 that are neither free nor evictable.")
    evictions: int = metric("counter", "Cached blocks evicted.")
    gc_runs: int = metric("counter", "Two-phase GC passes.")


def free_run_histogram(sizes: Iterable[int]) -> tuple[list[tuple[str, int]], int]:
    """Cumulative Prometheus buckets of free-run sizes and their sum."""
    ordered = sorted(sizes)
    buckets = [(str(b), sum(1 for s in ordered if s <= b)) for b in FREE_RUN_BUCKETS]
    buckets.append(("+Inf", len(ordered)))
    return buckets, sum(ordered)


def memory_stats(pool: BlockPool, cache: PrefixCache | None = None) -> MemoryStats:
    """Snapshot of `pool` (and the hit counters of `cache`); O(num_blocks)."""
    refs = pool.ref_counts()
    in_use = [r for r in refs if r > 0]
    free = pool.num_free
    largest = pool.largest_free_run()
    c = pool.counters
    queries = cache.query_blocks if cache is not None else 0
    hits = cache.hit_blocks if cache is not None else 0
    return MemoryStats(
        tier=str(pool.tier),
        pool_blocks={"free": free, "in_use": pool.num_in_use, "cached": pool.num_cached},
        pool_utilization=pool.num_in_use / pool.num_blocks,
        free_run_size_blocks=free_run_histogram(pool.free_run_sizes()),
        free_bytes=free * pool.block_bytes,
        largest_free_run_bytes=largest * pool.block_bytes,
        fragmentation_ratio=1.0 - largest / free if free else 0.0,
        oom={
            r: c.oom_by_reason.get(r, 0) for r in ("no_free_block", "no_contiguous_block", "ref_count_lock")
        },
        oom_by_seq_len=dict(c.oom_by_seq_len),
        preemptions=c.preemptions,
        swapped_to_host_bytes=c.swapped_to_host_bytes,
        prefix_query_blocks=queries,
        prefix_hit_blocks=hits,
        prefix_hit_rate=hits / queries if queries else 0.0,
        avg_ref_count=sum(in_use) / len(in_use) if in_use else 0.0,
        ghost_block_bytes=pool.ghost_blocks() * pool.block_bytes,
        evictions=c.evictions,
        gc_runs=c.gc_runs,
    )


class StatsCollector:
    """A prometheus_client collector over stats snapshots, taken fresh at every scrape.

    Register it on a CollectorRegistry to serve it; `render_prometheus` uses it for one-off text.
    """

    def __init__(self, snapshots: Callable[[], Iterable[Any]]) -> None:
        self._snapshots = snapshots

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Any] = {}  # name -> a *MetricFamily
        for snap in self._snapshots():
            fields = dataclasses.fields(snap)
            labels = {f.name: getattr(snap, f.name) for f in fields if "metric" not in f.metadata}
            for f in fields:
                spec = f.metadata.get("metric")
                if spec is not None:
                    _add_sample(families, f.name, spec, getattr(snap, f.name), labels)
        yield from families.values()


def _add_sample(
    families: dict[str, Any], name: str, spec: MetricSpec, value: Any, labels: Mapping[str, str]
) -> None:
    full = PREFIX + name
    label_names = list(labels) + ([spec.label] if spec.label else [])
    family = families.get(full)
    if family is None:
        cls = {"gauge": GaugeMetricFamily, "counter": CounterMetricFamily, "histogram": HistogramMetricFamily}
        family = families[full] = cls[spec.kind](full, spec.help, labels=label_names)
    base = [str(v) for v in labels.values()]
    if spec.kind == "histogram":
        buckets, total = value
        family.add_metric(base, buckets=buckets, sum_value=total)
    elif spec.label is not None:
        for key, v in sorted(value.items()):
            family.add_metric([*base, str(key)], v)
    else:
        family.add_metric(base, value)


def render_prometheus(snapshots: Iterable[Any]) -> str:
    """Prometheus text exposition of stats snapshots (e.g. one MemoryStats per tier)."""
    registry = CollectorRegistry(auto_describe=False)
    items = list(snapshots)
    registry.register(StatsCollector(lambda: items))  # type: ignore[arg-type]
    return generate_latest(registry).decode()
