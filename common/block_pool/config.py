"""Settings of one block pool: when two-phase GC runs and what it may evict (`PoolConfig`), and what
it calls out to as it evicts (`PoolHooks`); both are given when the pool is built."""

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from radixmesh.common.block_pool.eviction import DEFAULT_EVICTION, EVICTION_ORDERS, CopiesElsewhere
from radixmesh.common.block_pool.s3fifo import Recalled
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.ids import BlockId

EvictionListener = Callable[[Sequence[tuple[BlockId, BlockHash]]], None]
"""Hears (block, hash) pairs of every batch of cached blocks a pool evicts."""


@dataclass(frozen=True, slots=True)
class PoolConfig:
    """Eviction and garbage-collection policy of a BlockPool. Defaults suit a serving node; tests
    inject a clock."""

    eviction: str = DEFAULT_EVICTION
    """Which cached block goes first (a name in `eviction.EVICTION_ORDERS`): ``lru``, least recently
    released; ``s3fifo`` (the default, see eviction.DEFAULT_EVICTION), blocks used once before blocks
    used again (scan-resistant)."""

    idle_ttl_s: float = 30.0
    """Phase 1 of GC marks cached (ref 0, hashed) blocks released longer ago than this as candidates."""
    gc_trigger_free_run_blocks: int = 0
    """Allocation runs GC first when the largest contiguous free run is shorter than this many
    blocks; 0 turns the automatic trigger off (``gc()`` still works)."""
    gc_trigger_free_run_bytes: int = 0
    """The same trigger in bytes (e.g. 500 MB on a GPU), rounded up to whole blocks; the pool uses the
    larger of the two. 0: off."""
    gc_min_interval_s: float = 1.0
    """The automatic trigger fires at most once per this many seconds of the pool's clock, so a full
    pool does not rescan its cache on every allocation."""

    def __post_init__(self) -> None:
        if self.eviction not in EVICTION_ORDERS:
            raise ValueError(f"eviction must be one of {sorted(EVICTION_ORDERS)}, got {self.eviction!r}")
        if not (math.isfinite(self.idle_ttl_s) and self.idle_ttl_s >= 0):
            raise ValueError(f"idle_ttl_s must be a finite number >= 0, got {self.idle_ttl_s}")
        if self.gc_trigger_free_run_blocks < 0:
            raise ValueError(
                f"gc_trigger_free_run_blocks must be >= 0, got {self.gc_trigger_free_run_blocks}"
            )
        if self.gc_trigger_free_run_bytes < 0:
            raise ValueError(f"gc_trigger_free_run_bytes must be >= 0, got {self.gc_trigger_free_run_bytes}")
        if not (math.isfinite(self.gc_min_interval_s) and self.gc_min_interval_s >= 0):
            raise ValueError(f"gc_min_interval_s must be a finite number >= 0, got {self.gc_min_interval_s}")


@dataclass(frozen=True, slots=True)
class PoolHooks:
    """What a BlockPool calls out to, fixed when it is built; every default is "nothing"."""

    on_evict: EvictionListener | None = None
    """Called with (block, hash) pairs whenever cached blocks are evicted, after their hashes are
    cleared and before the blocks are freed or handed to the allocating caller, so their KV is still
    intact while it runs. A pool that a PrefixCache is built over leaves this None: the cache is its
    listener (and hands evictions on through its own `on_evict`)."""
    copies_elsewhere: CopiesElsewhere | None = None
    """Cluster-aware eviction (`ClusterPreference`): of the next k + `eviction_window` blocks of the
    eviction order, those another node holds go first. None: the order alone."""
    eviction_window: int = 0
    recalled: Recalled | None = None
    """Blocks stored under a hash the cluster evicted recently (the index's ghost) count as re-used
    in orders that tell first uses from re-uses (``s3fifo``). None: the pool's own evictions only."""

    def __post_init__(self) -> None:
        if self.eviction_window < 0:
            raise ValueError(f"eviction_window must be >= 0, got {self.eviction_window}")
