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

import heapq
import math
from collections.abc import Callable, Collection, Sequence

from radixmesh.proto.ids import NodeId

DEFAULT_HALF_LIFE_S = 150.0
"""Half-life of the recent-work measure, seconds: long against one prefill (so the window holds many
requests per node even on a large, lightly loaded cluster), short against shifts in traffic (tens of
minutes). 150 s was the best of 20-600 s on the bench traces (an earlier session's sweep; docs/routing.md names the half-life)."""


class RecentWork:
    """node -> exponentially decayed sum of the work routed to it, read on the injected clock."""

    def __init__(self, half_life_s: float, clock: Callable[[], float]) -> None:
        if not (math.isfinite(half_life_s) and half_life_s > 0):
            raise ValueError(f"half_life_s must be a finite number > 0, got {half_life_s}")
        self.half_life_s = half_life_s
        self._clock = clock
        # Lazy decay: each node keeps its value as of its last update and decays on read.
        self._value: dict[NodeId, tuple[float, float]] = {}
        # Every value decays at the same rate, so log2(value) + t / half_life orders the nodes the
        # same at any later time: `least` compares these keys without decaying anything.
        self._key: dict[NodeId, float] = {}
        self._total = (0.0, 0.0)
        """(sum of every node's value, as of time t)."""
        # For `least`: a heap of (key, node) over the last pool's nodes, stale items (a node's older
        # key) dropped as they surface; the last pool, as a set, and its nodes never given work.
        self._heap: list[tuple[float, NodeId]] = []
        self._pool: list[NodeId] = []
        self._members: set[NodeId] = set()
        self._untracked: set[NodeId] = set()

    def add(self, node: NodeId, work: float) -> None:
        """Record `work` (>= 0, finite) routed to `node` now; ValueError (and no change) otherwise."""
        if not (math.isfinite(work) and work >= 0):
            raise ValueError(f"work must be a finite number >= 0, got {work}")
        now = self._clock()
        value = self._decayed(node, now) + work
        self._value[node] = (value, now)
        key = math.log2(value) + now / self.half_life_s if value > 0 else -math.inf
        self._key[node] = key
        self._total = (self._decay(*self._total, now) + work, now)
        if node in self._members:
            heapq.heappush(self._heap, (key, node))
            self._untracked.discard(node)
            if len(self._heap) > 4 * len(self._members) + 64:  # stale items that never surfaced
                self._rebuild()

    def forget(self, node: NodeId) -> None:
        """Drop `node`'s work: it left the cluster, and what it was routed finished there or failed
        over, so when it comes back it ranks like a node never given work."""
        if node not in self._value:
            return
        now = self._clock()
        self._total = (max(0.0, self._decay(*self._total, now) - self._decayed(node, now)), now)
        del self._value[node], self._key[node]  # its heap items are stale now, dropped as they surface
        if node in self._members:
            self._untracked.add(node)

    def total(self) -> float:
        """Every node's decayed work summed, as of now; O(1)."""
        return self._decay(*self._total, self._clock())

    def least(self, k: int, pool: Sequence[NodeId], usable: Callable[[NodeId], bool]) -> list[NodeId]:
        """Up to `k` nodes of `pool` passing `usable` with the least work: nodes never given work
        first (by name), then by work. No value is decayed here: while the pool stays the same
        (compared in C) this costs O((k + refused) log n), whatever the pool's size."""
        if pool != self._pool:
            self._pool = list(pool)
            self._members = set(pool)
            self._untracked = self._members.difference(self._key)
            self._rebuild()
        out = _first(k, self._untracked, usable) if self._untracked else []
        heap, keys, seen, back = self._heap, self._key, set(out), []
        while heap and len(out) < k:
            key, node = heapq.heappop(heap)
            if keys.get(node) != key or node in seen:
                continue  # stale, or a duplicate: dropped for good
            seen.add(node)
            back.append((key, node))
            if usable(node):
                out.append(node)
        for item in back:
            heapq.heappush(heap, item)
        return out

    def _rebuild(self) -> None:
        keys = self._key
        self._heap = [(keys[n], n) for n in self._members if n in keys]
        heapq.heapify(self._heap)

    def value(self, node: NodeId) -> float:
        """`node`'s decayed work as of now (0.0 for a node never routed to)."""
        return self._decayed(node, self._clock())

    def _decayed(self, node: NodeId, now: float) -> float:
        v, t = self._value.get(node, (0.0, now))
        return self._decay(v, t, now)

    def _decay(self, v: float, t: float, now: float) -> float:
        # A clock that steps back (it should not) reads as no time passed, never as growth.
        return v * 2.0 ** (-max(0.0, now - t) / self.half_life_s)

    def check_invariants(self) -> None:
        """Every stored value is finite and >= 0."""
        for node, (v, t) in self._value.items():
            assert math.isfinite(v) and v >= 0 and math.isfinite(t), f"{node}: value {v} at {t}"
        assert self._key.keys() == self._value.keys(), "ordering keys differ from the values"
        live = {n for key, n in self._heap if self._key.get(n) == key}
        assert live == self._members & self._key.keys(), "a pool node given work is missing from the heap"


def _first(k: int, nodes: Collection[NodeId], usable: Callable[[NodeId], bool]) -> list[NodeId]:
    """The `k` first of `nodes` by name that pass `usable`: nsmallest over a few extra first, a full
    pass only when `usable` refused too many."""
    picked: list[NodeId] = []
    for extra in (k + 8, len(nodes)):
        picked = [n for n in heapq.nsmallest(extra, nodes) if usable(n)]
        if len(picked) >= k or extra >= len(nodes):
            break
    return picked[:k]
