"""Prometheus text exposition of plain stats snapshots: the one place radixmesh writes metrics.

A frozen stats dataclass joins by declaring its metric fields with `metric(...)`: each such field
becomes ``radixmesh_<field name>`` (a counter gains ``_total`` in the text), or the exact name a
protocol fixes (`metric(..., name="vllm:num_requests_waiting")`: what the Gateway API Inference
Extension's endpoint pickers scrape), and the snapshot's plain ``str`` fields become labels on every
sample it renders; a metric field holding None renders no sample (a figure that snapshot lacks). The
memory tiers, the engine, the agent and the router all export this way; live counts stay in mutable
counters that their owner updates, and a `Histogram` among them is frozen into a `HistogramSnapshot`
with the rest of the snapshot.
"""

import dataclasses
import itertools
import math
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

PREFIX = "radixmesh_"

MetricKind = Literal["gauge", "counter", "histogram"]
_FAMILIES = {"gauge": GaugeMetricFamily, "counter": CounterMetricFamily, "histogram": HistogramMetricFamily}


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """How one stats field renders: kind, help text, and the labels its dict keys fill (if a dict)."""

    kind: MetricKind
    help: str
    labels: tuple[str, ...] = ()
    name: str | None = None
    """The family's exact name where a protocol fixes it; None: radixmesh_<field name>."""

    def family(self, field_name: str) -> str:
        """The family name `field_name` renders under (before a counter's _total)."""
        return self.name if self.name is not None else PREFIX + field_name


def metric(kind: MetricKind, help: str, *labels: str, name: str | None = None) -> Any:
    """A dataclass field (no default) declaring a stats field a metric, named `name` if given and
    ``radixmesh_<field name>`` otherwise. vLLM's colon names are valid Prometheus names, though
    `promtool check metrics` lints each (it reserves colons for recording rules).

    Without `labels` the value is one number (a `HistogramSnapshot` for a histogram); with them it is
    a dict whose keys fill them: a ``str`` for one label, a tuple of ``str`` in `labels` order for
    several. A histogram counts observations since start: a point-in-time distribution is not one
    (its buckets would shrink, and rate() over them means nothing), so it is a labelled gauge.
    """
    return field(metadata={"metric": MetricSpec(kind, help, labels, name)})


@dataclass(frozen=True, slots=True)
class HistogramSnapshot:
    """A histogram at one instant: cumulative counts of observations <= each bound, their count and sum."""

    bounds: tuple[float, ...]
    cumulative: tuple[int, ...]
    count: int
    sum: float

    def buckets(self) -> list[tuple[str, float]]:
        """Prometheus buckets: (le, cumulative count), ascending, ending with ("+Inf", count)."""
        return [*((floatToGoString(b), n) for b, n in zip(self.bounds, self.cumulative)), ("+Inf", self.count)]


@dataclass(slots=True)
class Histogram:
    """Observations counted into fixed buckets as they happen (mutable); `snapshot()` freezes them."""

    bounds: tuple[float, ...]
    """Finite upper bounds, ascending; +Inf is implied."""
    per_bucket: list[int] = field(init=False)
    """Observations in (bounds[i-1], bounds[i]]: not cumulative until `snapshot()`."""
    count: int = 0
    sum: float = 0.0

    def __post_init__(self) -> None:
        if not self.bounds or any(not math.isfinite(b) for b in self.bounds) or list(self.bounds) != sorted(
                set(self.bounds)):
            raise ValueError(f"histogram bounds must be finite and strictly ascending: {self.bounds}")
        self.per_bucket = [0] * len(self.bounds)

    def observe(self, value: float) -> None:
        i = bisect_left(self.bounds, value)  # the first bound >= value: Prometheus buckets are "le"
        if i < len(self.bounds):
            self.per_bucket[i] += 1
        self.count += 1
        self.sum += value

    def snapshot(self) -> HistogramSnapshot:
        return HistogramSnapshot(self.bounds, tuple(itertools.accumulate(self.per_bucket)), self.count, self.sum)


def stats_families(snapshots: Iterable[Any], labels: Mapping[str, str] | None = None) -> list[Metric]:
    """One metric family per metric field name across `snapshots`, samples in snapshot order; every
    sample carries `labels` first (the deployment's `model_name`, as vLLM labels its families)."""
    families: dict[str, Any] = {}  # name -> a *MetricFamily (their add_metric signatures differ)
    common = dict(labels or {})
    for snap in snapshots:
        fields = dataclasses.fields(snap)
        own = {f.name: getattr(snap, f.name) for f in fields if "metric" not in f.metadata}
        assert not own.keys() & common.keys(), f"{type(snap).__name__} sets a common label itself"
        snap_labels = {**common, **own}
        for f in fields:
            spec = f.metadata.get("metric")
            value = getattr(snap, f.name)
            if spec is not None and value is not None:
                _add_samples(families, spec.family(f.name), spec, value, snap_labels)
    return list(families.values())


def _add_samples(families: dict[str, Any], full: str, spec: MetricSpec, value: Any,
                 labels: Mapping[str, str]) -> None:
    label_names = [*labels, *spec.labels]
    family = families.get(full)
    if family is None:
        family = families[full] = _FAMILIES[spec.kind](full, spec.help, labels=label_names)
    assert family.type == spec.kind, f"{full} is both a {family.type} and a {spec.kind}"
    base = [str(v) for v in labels.values()]
    keyed = value.items() if spec.labels else [((), value)]
    for key, v in keyed:
        key_values = key if isinstance(key, tuple) else (key,)
        assert len(key_values) == len(spec.labels), f"{full}: key {key!r} does not fill {spec.labels}"
        label_values = [*base, *(str(k) for k in key_values)]
        if spec.kind == "histogram":
            family.add_metric(label_values, buckets=v.buckets(), sum_value=v.sum)
        else:
            family.add_metric(label_values, v)


class _Families:
    """A one-shot collector over built families (generate_latest reads a registry's collect())."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def write_exposition(families: Iterable[Metric]) -> str:
    """Prometheus text format 0.0.4 of `families` (each family written once, in order)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(list(families)))  # type: ignore[arg-type]
    return generate_latest(registry).decode()


def render_prometheus(snapshots: Iterable[Any], labels: Mapping[str, str] | None = None) -> str:
    """Prometheus text exposition of stats snapshots (e.g. one MemoryStats per tier, one EngineStats),
    every sample labelled with `labels` too."""
    return write_exposition(stats_families(snapshots, labels))
