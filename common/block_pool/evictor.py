"""Taking cached blocks out of a pool's cache: which ones go, and what every evicted block goes
through (its hash cleared, counted, the listener told) whichever path evicted it."""

from radixmesh.common.block_pool.config import EvictionListener, PoolHooks
from radixmesh.common.block_pool.counters import PoolCounters
from radixmesh.common.block_pool.eviction import ClusterPreference, EvictionOrder
from radixmesh.common.block_pool.free_runs import FreeRuns
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.ids import BlockId


class Evictor:
    """Evicts the cached blocks of one BlockPool. It shares the pool's `order` and `hashes` (the
    pool's lists, mutated in place) and `counters`; the blocks it returns or frees are the pool's
    to place. The pool checks every request before it calls here, so nothing here raises."""

    def __init__(self, order: EvictionOrder, hashes: list[BlockHash | None], counters: PoolCounters,
                 hooks: PoolHooks) -> None:
        self._order, self._hash, self._counters = order, hashes, counters
        self.listener: EvictionListener | None = hooks.on_evict
        """Hears every batch of evicted blocks (PoolHooks.on_evict, or the PrefixCache attached later)."""
        self._preference: ClusterPreference | None = None
        if hooks.copies_elsewhere is not None:
            self._preference = ClusterPreference(hooks.copies_elsewhere, hooks.eviction_window)

    def take(self, k: int) -> list[int]:
        """Evict k cached blocks (k <= cached) in the eviction order, or, with cluster-aware
        eviction, those another node holds first; the caller reuses or frees them."""
        pref = self._preference
        victims = self._order.pop_oldest(k) if pref is None or k == 0 else pref.choose(self._order, self._hash, k)
        self._forget(victims)
        return victims

    def drop(self, blocks: list[int]) -> None:
        """Evict exactly `blocks` (cached ones), whatever their place in the order."""
        self._order.discard(blocks)
        self._forget(blocks)

    def idle(self, free: FreeRuns, cutoff: float) -> int:
        """Two-phase GC; returns the number of blocks evicted into `free`.

        Phase 1 marks cached blocks released before `cutoff` as candidates. Phase 2 evicts only
        candidates that border a free run, growing runs outward from it (an eviction makes its
        candidate neighbours border a run too), so contiguous free space forms while isolated idle
        blocks stay matchable until an allocation needs them.
        """
        evicted = free.growth_order(self._order.released_before(cutoff))
        for b in evicted:
            self.drop([b])
            free.add_run(b, 1)
        return len(evicted)

    def _forget(self, blocks: list[int]) -> None:
        """Clear the hashes of blocks just taken out of the order and tell the listener."""
        if not blocks:
            return
        pairs = []
        for b in blocks:
            h = self._hash[b]
            assert h is not None, f"evicted block {b} had no hash"
            pairs.append((BlockId(b), h))
            self._hash[b] = None
        self._counters.evictions += len(blocks)
        if self.listener is not None:
            self.listener(pairs)
