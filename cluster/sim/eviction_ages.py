"""How many blocks a cache evicts and how recently they were used, by kind: `SimReport.evictions`.

A cluster of node caches loses to one pooled cache of the same memory where it evicts a block the
pooled cache would still hold. A duplicate's eviction loses nothing (another node still has it); a
last copy's does, and it is a loss against the pooled cache when that block is younger than what
the pooled cache evicts. Age: trace seconds since the last request holding the block arrived.
"""

import statistics
from collections.abc import Sequence
from typing import NamedTuple

from radixmesh.proto.block_hash import BlockHash

KINDS = ("last_copy", "duplicate", "global_lru")
"""A node's eviction of the cluster's last copy, of a block another node holds, and the pooled
global LRU cache's eviction (`oracle.global_cache`)."""


class EvictionSummary(NamedTuple):
    blocks: int
    age_p50_s: float
    """Median age at eviction (0.0 for no eviction)."""


class EvictionAges:
    """Ages of evicted blocks over one pass of `prompts` (arriving at `arrivals`, in order)."""

    def __init__(self, arrivals: Sequence[float], prompts: Sequence[Sequence[BlockHash]]) -> None:
        assert len(arrivals) == len(prompts), "one arrival time per prompt"
        self._arrivals, self._prompts = arrivals, prompts
        self._last_use: dict[BlockHash, float] = {}
        self._seen = 0
        self._ages: dict[str, list[float]] = {k: [] for k in KINDS}

    def evicted(self, kind: str, hashes: Sequence[BlockHash], arrived: int, now: float) -> None:
        """`hashes` were evicted at `now`, when the first `arrived` prompts had arrived."""
        last, prompts = self._last_use, self._prompts
        for i in range(self._seen, arrived):
            t = self._arrivals[i]
            for h in prompts[i]:
                last[h] = t
        self._seen = max(self._seen, arrived)
        self._ages[kind].extend(now - last[h] for h in hashes)

    def summary(self) -> dict[str, EvictionSummary]:
        return {
            k: EvictionSummary(len(a), statistics.median(a) if a else 0.0) for k, a in self._ages.items() if a
        }
