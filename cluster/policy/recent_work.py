"""Work routed to each node recently: the bounded-load measure of the routing policies.

Requests in flight at one moment undercount load when requests are short and the cluster large:
a hot prefix's holder can take request after request while each finishes before the next arrives.
Bounding recent *work* instead bounds what a report over the run measures (work routed per node).
Work routed at time t counts 2^-((now - t) / half_life) at time now, so the measure follows shifts in
traffic within a few half-lives and needs O(1) state per node. The router and the simulator both
record every routed request here and copy `value(node)` into `NodeView.recent_tokens`.

Why decaying windows bound totals: all values decay at the same rate between routings, so a cap
L_i <= c x mean(L) kept at every routing also holds for sum over time of (work routed to i), which
is L_i(T) + ln2/half_life x integral of L_i dt.
"""

import math
from collections.abc import Callable

from radixmesh.proto.ids import NodeId

DEFAULT_HALF_LIFE_S = 150.0
"""Half-life of the recent-work measure, seconds: long against one prefill (so the window holds many
requests per node even on a large, lightly loaded cluster), short against shifts in traffic (tens of
minutes). 150 s was the best of 20-600 s on the bench traces (README)."""


class RecentWork:
    """node -> exponentially decayed sum of the work routed to it, read on the injected clock."""

    def __init__(self, half_life_s: float, clock: Callable[[], float]) -> None:
        if not (math.isfinite(half_life_s) and half_life_s > 0):
            raise ValueError(f"half_life_s must be a finite number > 0, got {half_life_s}")
        self.half_life_s = half_life_s
        self._clock = clock
        # Lazy decay: each node keeps its value as of its last update and decays on read.
        self._value: dict[NodeId, tuple[float, float]] = {}

    def add(self, node: NodeId, work: float) -> None:
        """Record `work` (>= 0, finite) routed to `node` now; ValueError (and no change) otherwise."""
        if not (math.isfinite(work) and work >= 0):
            raise ValueError(f"work must be a finite number >= 0, got {work}")
        now = self._clock()
        self._value[node] = (self._decayed(node, now) + work, now)

    def value(self, node: NodeId) -> float:
        """`node`'s decayed work as of now (0.0 for a node never routed to)."""
        return self._decayed(node, self._clock())

    def _decayed(self, node: NodeId, now: float) -> float:
        v, t = self._value.get(node, (0.0, now))
        # A clock that steps back (it should not) reads as no time passed, never as growth.
        return v * 2.0 ** (-max(0.0, now - t) / self.half_life_s)

    def check_invariants(self) -> None:
        """Every stored value is finite and >= 0."""
        for node, (v, t) in self._value.items():
            assert math.isfinite(v) and v >= 0 and math.isfinite(t), f"{node}: value {v} at {t}"
