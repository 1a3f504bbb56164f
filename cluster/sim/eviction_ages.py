"""How many blocks a cache evicts and how recently they were used, by kind: `SimReport.evictions`.

A cluster of node caches loses to one pooled cache of the same memory where it evicts a block the
pooled cache would still hold. A duplicate's eviction loses nothing (another node still has it); a
last copy's does, and it is a loss against the pooled cache when that block is younger than what
the pooled cache evicts. Age: trace seconds since the last request holding the block arrived.
"""

import statistics
from collections.abc import Callable, Sequence
from typing import NamedTuple

from radixmesh.cluster.sim.oracle import global_cache
from radixmesh.proto.block_hash import BlockHash

KINDS = ("last_copy", "duplicate", "global_lru")
"""A node's eviction of the cluster's last copy, of a block another node holds, and the pooled
global LRU cache's eviction (`oracle.global_cache`)."""


class EvictionSummary(NamedTuple):
    blocks: int
    age_p50_s: float
    """Median age at eviction."""


class EvictionAges:
    """Ages of evicted blocks: told of every arriving request's blocks, then of evictions."""

    def __init__(self) -> None:
        self._last_use: dict[BlockHash, float] = {}
        self._ages: dict[str, list[float]] = {k: [] for k in KINDS}

    def used(self, hashes: Sequence[BlockHash], now: float) -> None:
        """A request holding `hashes` arrived at `now`."""
        last = self._last_use
        for h in hashes:
            last[h] = now

    def evicted(self, kind: str, hashes: Sequence[BlockHash], now: float) -> None:
        self._ages[kind].extend(now - self._last_use[h] for h in hashes)

    def node_evicted(self, hashes: Sequence[BlockHash], holders: Callable[[BlockHash], int], now: float) -> None:
        """A node evicted `hashes`: last copies or duplicates by `holders`, which still counts that
        node's own copy (its removal is not applied yet)."""
        last: list[BlockHash] = []
        duplicate: list[BlockHash] = []
        for h in hashes:
            (last if holders(h) <= 1 else duplicate).append(h)
        for kind, group in (("last_copy", last), ("duplicate", duplicate)):
            if group:
                self.evicted(kind, group, now)

    def summary(self) -> dict[str, EvictionSummary]:
        """Kinds with at least one eviction."""
        return {k: EvictionSummary(len(a), statistics.median(a)) for k, a in self._ages.items() if a}


def pooled_lru(
    prompts: Sequence[Sequence[BlockHash]], arrivals: Sequence[float], capacity_blocks: int
) -> tuple[float, dict[str, EvictionSummary]]:
    """`global_cache`'s LRU hit rate over `prompts` in order, and its evictions' ages."""
    ages = EvictionAges()
    seen = 0

    def heard(i: int, hashes: list[BlockHash]) -> None:
        nonlocal seen
        for j in range(seen, i + 1):  # prompt i has arrived too, as in the cluster
            ages.used(prompts[j], arrivals[j])
        seen = i + 1
        ages.evicted("global_lru", hashes, arrivals[i])

    return global_cache(prompts, capacity_blocks, "lru", heard), ages.summary()
