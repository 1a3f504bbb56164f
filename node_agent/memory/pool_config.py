"""Settings of one block pool: when two-phase GC runs and what it may evict."""

import math
from dataclasses import dataclass

from radixmesh.node_agent.memory.eviction import DEFAULT_EVICTION, EVICTION_ORDERS


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
