"""Paged KV block pool of one tier: refcounts, lazy eviction in a chosen order, contiguity and
two-phase GC."""

import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence

from radixmesh.common.block_pool.config import EvictionListener, PoolConfig, PoolHooks
from radixmesh.common.block_pool.counters import OOMReason, OutOfBlocks, PoolCounters
from radixmesh.common.block_pool.eviction import make_eviction_order
from radixmesh.common.block_pool.evictor import Evictor
from radixmesh.common.block_pool.free_runs import FreeRuns, cheapest_window
from radixmesh.common.block_pool.lru import read_many
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.events import Tier
from radixmesh.proto.ids import BlockId

logger = logging.getLogger(__name__)

__all__ = ["BlockPool", "EvictionListener", "OOMReason", "OutOfBlocks", "PoolHooks"]


class BlockPool:
    """A fixed number of KV blocks of one tier, each exactly one of: free, in use (ref > 0) or
    cached (ref 0 and hashed: still matchable, evictable in the order `config.eviction` names).

    Per-block state lives in flat lists indexed by BlockId (refcount, hash), free blocks in
    `FreeRuns`, cached ones in an `EvictionOrder` (lazy, like `LazyLRU`), so allocate / free /
    incref cost O(1) per block.
    Every method that raises leaves the pool unchanged.

    `hooks` (PoolHooks) are what the pool calls out to as it evicts: a listener, the cluster's
    copies for cluster-aware eviction (both held by its `Evictor`), its recently evicted hashes.
    They are fixed at construction; the one link made later is a PrefixCache's, which becomes the
    listener of the pool it is built over (`attach_cache`). The zone caps (`set_zone_limits`) are
    state, not a hook: the zone governor moves them every engine step.
    """

    def __init__(
        self,
        num_blocks: int,
        *,
        tier: Tier = Tier.GPU,
        block_bytes: int = 0,
        config: PoolConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
        hooks: PoolHooks | None = None,
    ) -> None:
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        if block_bytes < 0:
            raise ValueError(f"block_bytes must be >= 0, got {block_bytes}")
        self.num_blocks = num_blocks
        self.tier = tier
        self.block_bytes = block_bytes
        self.config = config or PoolConfig()
        cfg = self.config
        by_bytes = -(-cfg.gc_trigger_free_run_bytes // block_bytes) if block_bytes else 0
        self.gc_trigger_blocks = max(cfg.gc_trigger_free_run_blocks, by_bytes)
        """Automatic GC runs when the largest free run is shorter than this (0: never)."""
        self.counters = PoolCounters()
        self._clock = clock
        self._ref = [0] * num_blocks
        self._hash: list[BlockHash | None] = [None] * num_blocks
        self._free = FreeRuns(num_blocks)
        self._order = make_eviction_order(cfg.eviction, self._ref, self._hash)
        self._num_in_use = 0
        self._last_gc = clock()
        hooks = hooks or PoolHooks()
        self._evictor = Evictor(self._order, self._hash, self.counters, hooks)
        self._kv_limit: int | None = None
        self._prefix_limit: int | None = None
        if hooks.recalled is not None:
            self._order.set_recall(hooks.recalled)

    # --- state -------------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return self._free.num_free

    @property
    def num_cached(self) -> int:
        # Every block is free, in use or cached (check_invariants proves it), so this needs no counter.
        return self.num_blocks - self._free.num_free - self._num_in_use

    @property
    def num_in_use(self) -> int:
        return self._num_in_use

    def ref_count(self, block_id: BlockId) -> int:
        self._check_ids([block_id])
        return self._ref[block_id]

    def hash_of(self, block_id: BlockId) -> BlockHash | None:
        """The hash a block is cached under, None for a private (unhashed) or free block."""
        self._check_ids([block_id])
        return self._hash[block_id]

    def largest_free_run(self) -> int:
        """Longest run of consecutive free blocks."""
        return self._free.largest()

    def free_run_sizes(self) -> list[int]:
        """Length of every maximal free run, ascending."""
        return self._free.sizes()

    def ref_counts(self) -> list[int]:
        """A copy of every block's refcount, by BlockId (for metrics and tests)."""
        return list(self._ref)

    # --- allocation --------------------------------------------------------------------------
    def allocate(self, n: int, *, contiguous: bool = False, seq_len: int | None = None) -> list[BlockId]:
        """n blocks with ref 1 and no hash, all or nothing.

        Free blocks first (the best-fitting contiguous free run when one exists), then cached
        blocks evicted in the eviction order. ``contiguous=True`` demands consecutive ids
        and evicts the window of cached blocks that needs the fewest evictions. `seq_len` (tokens
        of the sequence served) only labels an OOM in the metrics. Raises OutOfBlocks.
        """
        if n < 0:
            raise ValueError(f"cannot allocate a negative number of blocks ({n})")
        if n == 0:
            return []
        self._maybe_auto_gc()
        free = self._free
        if n > free.num_free + self.num_cached:
            raise self._oom(n, seq_len, None)
        if self._kv_limit is not None and self._num_in_use + n > self._kv_limit:
            raise self._oom(n, seq_len, "zone_limit")
        if contiguous:
            got = free.take_run(n)
            ids = got if got is not None else self._carve_window(n, seq_len)
        elif n <= free.num_free:
            ids = free.take(n)
        else:
            victims = self._evictor.take(n - free.num_free)
            ids = (free.take(free.num_free) if free.num_free else []) + victims
        ref = self._ref
        for b in ids:
            ref[b] = 1
        self._num_in_use += n
        return ids  # type: ignore[return-value]  # ints are BlockIds here

    def incref(self, block_ids: Sequence[BlockId]) -> None:
        """Add one reference to each block (in use or cached; a cached block stops being evictable)."""
        self._check_ids(block_ids)
        hashes, ref = self._hash, self._ref
        free = sorted({b for b in block_ids if not ref[b] and hashes[b] is None})
        if free:
            raise ValueError(f"incref of free blocks {free}")
        if len(set(block_ids)) == len(block_ids):
            self.pin(block_ids)
            return
        self._num_in_use += len({b for b in block_ids if not ref[b]})
        for b in block_ids:
            ref[b] += 1

    def pin(self, block_ids: Sequence[BlockId]) -> None:
        """incref without validation, for PrefixCache.match: the ids come from its table, so they
        are distinct, in range and hashed. Anyone else calls incref."""
        ref = self._ref
        # Blocks leaving ref 0 are counted on the refcounts read in one C call, which is cheaper
        # than a branch per block in the loop (plain loops over flat lists beat map() and numpy).
        self._num_in_use += read_many(ref, block_ids).count(0)
        for b in block_ids:
            ref[b] += 1

    def free(self, block_ids: Sequence[BlockId]) -> None:
        """Drop one reference from each block. At ref 0 a hashed block becomes cached (evictable,
        most recently released), an unhashed one free. Raises ValueError on a block not in use."""
        ref = self._ref
        n = len(block_ids)
        # Reversed: a sequence releases head to tail, and its tail blocks are evicted first, since
        # a chain's head still matches without its tail but not the other way round.
        released = tuple(reversed(block_ids))
        group = self._order.group_of(released)
        if group is not None and read_many(ref, released).count(1) == n:
            # Exactly the blocks released together last time (group_of vouches for them), each
            # held once: the group moves to the LRU's tail whole, with no check or stamp per block.
            for b in released:
                ref[b] = 0
            self._num_in_use -= n
            self._order.renew(group, self._clock())
            if self._prefix_limit is not None:
                self._enforce_prefix_limit()
            return
        # Next fastest, a first release: distinct blocks (set) in range (min, and IndexError from
        # the read), each held once, so each reaches ref 0.
        try:
            exact = n > 1 and min(block_ids) >= 0 and read_many(ref, block_ids).count(1) == n
        except IndexError:
            exact = False
        if exact and len(set(block_ids)) == n:
            for b in block_ids:
                ref[b] = 0
            self._num_in_use -= n
            self._retire(list(released))
            return
        self._check_ids(block_ids)
        if len(set(block_ids)) < n or 0 in read_many(ref, block_ids):
            self._free_repeated(block_ids)
            return
        for b in block_ids:
            ref[b] -= 1
        zeros = [b for b in released if not ref[b]]
        self._num_in_use -= len(zeros)
        self._retire(zeros)

    def _free_repeated(self, block_ids: Sequence[BlockId]) -> None:
        """The slow path of free: repeated ids, or a block freed more often than referenced."""
        counts = Counter(block_ids)
        over = sorted(b for b, c in counts.items() if c > self._ref[b])
        if over:
            raise ValueError(f"free of blocks not in use (or freed more times than referenced): {over}")
        for b, c in counts.items():
            self._ref[b] -= c
        zeros = [b for b in dict.fromkeys(reversed(block_ids)) if not self._ref[b]]
        self._num_in_use -= len(zeros)
        self._retire(zeros)

    def _retire(self, zeros: Sequence[int]) -> None:
        """Blocks that just reached ref 0 (already uncounted from in use): hashed ones to the LRU,
        the others to the free runs."""
        if not zeros:
            return
        hashes = self._hash
        if None not in read_many(hashes, zeros):
            self._order.push(zeros, self._clock())
            if self._prefix_limit is not None:
                self._enforce_prefix_limit()
            return
        cached = [b for b in zeros if hashes[b] is not None]
        if cached:
            self._order.push(cached, self._clock())
        self._free.add(b for b in zeros if hashes[b] is None)
        self._enforce_prefix_limit()

    def set_hash(self, block_id: BlockId, block_hash: BlockHash) -> None:
        """Name an in-use, unhashed block by its hash (PrefixCache.insert); at ref 0 it is cached."""
        self._check_ids([block_id])
        if not self._ref[block_id] or self._hash[block_id] is not None:
            raise ValueError(f"block {block_id} is not an in-use unhashed block")
        self._hash[block_id] = block_hash

    def attach_cache(self, listener: EvictionListener) -> None:
        """The PrefixCache built over this pool hears its evictions (see PoolHooks.on_evict): called
        once, by the cache's constructor. Raises ValueError when the pool already has a listener
        (its hooks' or another cache's)."""
        if self._evictor.listener is not None:
            raise ValueError(f"this {self.tier} pool already has an eviction listener")
        self._evictor.listener = listener

    def set_zone_limits(self, kv_blocks: int | None, prefix_blocks: int | None) -> int:
        """Cap the blocks in use (the kv zone: allocate refuses past it with ``zone_limit``) and the
        cached blocks (the prefix zone: the least recently released beyond it are evicted at once,
        and again whenever a release passes it). None lifts a cap. Returns the blocks evicted now."""
        if (kv_blocks is not None and kv_blocks < 0) or (prefix_blocks is not None and prefix_blocks < 0):
            raise ValueError(f"zone limits must be >= 0, got {kv_blocks}, {prefix_blocks}")
        self._kv_limit, self._prefix_limit = kv_blocks, prefix_blocks
        return self._enforce_prefix_limit()

    @property
    def zone_limits(self) -> tuple[int | None, int | None]:
        """The (kv, prefix) caps in blocks that set_zone_limits set; None: uncapped."""
        return self._kv_limit, self._prefix_limit

    def _enforce_prefix_limit(self) -> int:
        limit = self._prefix_limit
        if limit is None or self.num_cached <= limit:
            return 0
        return self.evict(self.num_cached - limit)

    def record_preemption(self, swapped_bytes: int) -> None:
        """Count a preempted sequence and the bytes it moved to the host tier (0 when recomputed)."""
        if swapped_bytes < 0:
            raise ValueError(f"swapped_bytes must be >= 0, got {swapped_bytes}")
        self.counters.preemptions += 1
        self.counters.swapped_to_host_bytes += swapped_bytes

    # --- eviction and GC ---------------------------------------------------------------------
    def evict(self, n: int) -> int:
        """Evict up to n cached blocks, in the eviction order, into the free runs."""
        if n < 0:
            raise ValueError(f"cannot evict a negative number of blocks ({n})")
        victims = self._evictor.take(min(n, self.num_cached))
        self._free.add(victims)
        return len(victims)

    def gc(self) -> int:
        """Two-phase GC (Evictor.idle) of blocks released more than ``idle_ttl_s`` ago; returns the
        number of blocks evicted."""
        now = self._clock()
        self._last_gc = now
        self.counters.gc_runs += 1
        evicted = self._evictor.idle(self._free, now - self.config.idle_ttl_s)
        if evicted:
            logger.debug("gc on %s evicted %d idle blocks", self.tier, evicted)
        return evicted

    def _maybe_auto_gc(self) -> None:
        trigger = self.gc_trigger_blocks
        short = trigger and self._free.largest() < trigger
        if short and self._clock() - self._last_gc >= self.config.gc_min_interval_s:
            self.counters.gc_auto_runs += 1
            self.gc()

    def demote(self, block_ids: Sequence[BlockId]) -> int:
        """Cached blocks among `block_ids` that a peer now holds too (it pulled them from us) are
        evicted before every other cached block, unless re-used here first: the cluster keeps one
        copy of a hand-off instead of two. Blocks in use or free are left alone (a running request
        still reads them). Returns how many were demoted; ValueError on ids out of range."""
        self._check_ids(block_ids)
        order = self._order
        cached = [b for b in dict.fromkeys(block_ids) if b in order]
        order.demote(cached)
        return len(cached)

    def _carve_window(self, n: int, seq_len: int | None) -> list[int]:
        """A run of n blocks that are free or cached, evicting its cached ones; O(num_blocks), which
        is acceptable because it only runs when no free run fits a contiguous request."""
        best_start = cheapest_window(self._ref, self._order, n)
        if best_start is None:
            raise self._oom(n, seq_len, "no_contiguous_block")
        window = [b for b in range(best_start, best_start + n) if b in self._order]
        self._evictor.drop(window)
        self._free.add(window)
        return self._free.take_range(best_start, n)

    def _oom(self, n: int, seq_len: int | None, reason: OOMReason | None) -> OutOfBlocks:
        free, cached = self._free.num_free, self.num_cached
        pinned_hashed = sum(1 for b, r in enumerate(self._ref) if r and self._hash[b] is not None)
        if reason is None:
            reason = "ref_count_lock" if free + cached + pinned_hashed >= n else "no_free_block"
        self.counters.record_oom(reason, seq_len)
        detail = (
            f"free={free} cached={cached} in_use={self._num_in_use} pinned_prefix={pinned_hashed} "
            f"largest_run={self._free.largest()} of {self.num_blocks}"
        )
        logger.info("%s OOM on %s: %d blocks requested, %s", reason, self.tier, n, detail)
        return OutOfBlocks(reason, n, detail)

    def _check_ids(self, block_ids: Sequence[int]) -> None:
        if block_ids and (min(block_ids) < 0 or max(block_ids) >= self.num_blocks):
            raise ValueError(f"block ids must lie in [0, {self.num_blocks}), got {list(block_ids)}")

    # --- invariants --------------------------------------------------------------------------
    def ghost_blocks(self) -> int:
        """Blocks with ref 0 that are neither free nor cached-evictable (0 unless there is a bug)."""
        free = {b for start, length in self._free.runs() for b in range(start, start + length)}
        order = self._order
        return sum(1 for b, r in enumerate(self._ref) if not r and b not in free and b not in order)

    def check_invariants(self) -> None:
        """Raise AssertionError (with the numbers) unless every block is in exactly one state."""
        self._free.check_invariants(self.num_blocks)
        self._order.check_invariants()
        free = {b for start, length in self._free.runs() for b in range(start, start + length)}
        members = set(self._order.members())
        assert not free & members, f"blocks both free and cached: {sorted(free & members)[:10]}"
        in_use = [b for b, r in enumerate(self._ref) if r > 0]
        assert all(r >= 0 for r in self._ref), "negative refcount"
        assert len(in_use) == self._num_in_use, (
            f"{len(in_use)} blocks have ref > 0, counter {self._num_in_use}"
        )
        assert not free & set(in_use), f"free blocks with references: {sorted(free & set(in_use))[:10]}"
        hashed_idle = {b for b, r in enumerate(self._ref) if not r and self._hash[b] is not None}
        assert hashed_idle == members, (
            f"cached set != hashed ref-0 blocks: {sorted(hashed_idle ^ members)[:10]}"
        )
        assert all(self._hash[b] is None for b in free), "a free block keeps a hash"
        ghosts = self.num_blocks - len(free) - len(members) - len(in_use)
        assert ghosts == 0, (
            f"{ghosts} ghost blocks: free={len(free)} cached={len(members)} in_use={len(in_use)} "
            f"of {self.num_blocks}"
        )

