"""A node's memory tiers (gpu and host): each a block pool, its prefix cache and the KV tensor the
pool's block ids index; the one way blocks are copied between tiers; and the moves only the host
tier makes possible: promoting host hits to the gpu, swapping a preempted sequence's blocks out and
back in, and demoting evicted gpu prefix blocks. A disk tier under the host takes what it evicts and
reads back through it; `persist_resident` fills the disk on a clean stop; `NoHostTier` is the null
host tier. How they fit, and why: docs/memory.md#tiers.
"""

import logging
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol

import torch

from radixmesh.common.block_pool.block_pool import BlockPool
from radixmesh.common.block_pool.config import PoolConfig, PoolHooks
from radixmesh.common.block_pool.counters import OutOfBlocks
from radixmesh.common.prefix_cache.prefix_cache import EvictedBlock, EvictionHook, PrefixCache
from radixmesh.kernels import ops as kernels
from radixmesh.node_agent.memory.disk.tier import DiskTier, NoDiskTier
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.events import Tier
from radixmesh.proto.ids import BlockId
from radixmesh.proto.kv_layout import KVLayout

log = logging.getLogger(__name__)


class TierMemory:
    """One tier: a pool, its prefix cache, and the cache tensor the pool's block ids index."""

    def __init__(self, layout: KVLayout, num_blocks: int, tier: Tier, device: str | torch.device,
                 config: PoolConfig, clock: Callable[[], float], on_evict: EvictionHook | None = None,
                 hooks: PoolHooks | None = None) -> None:
        self.kv = layout.new_cache(num_blocks, device)
        self.pool = BlockPool(num_blocks, tier=tier, block_bytes=layout.block_bytes, config=config, clock=clock,
                              hooks=hooks)
        self.cache = PrefixCache(self.pool, on_evict=on_evict)


def copy_blocks(src: TierMemory, src_ids: Sequence[BlockId], dst: TierMemory, dst_ids: Sequence[BlockId]) -> None:
    """Copy whole blocks (every layer, K and V) between tiers: one gather, one scatter."""
    buffer = kernels.gather_blocks(src.kv, src_ids)
    kernels.scatter_blocks(buffer.to(dst.kv.device), dst.kv, dst_ids)


class Promoted(NamedTuple):
    """Gpu blocks a promotion filled (held once by the caller), and how many of them the host had
    first read from its disk tier (the request's local_disk hits; the rest are local_host)."""

    block_ids: list[BlockId]
    from_disk: int = 0


class TierMoves(Protocol):
    """Where the host tier counts its moves (the engine's EngineCounters)."""

    promoted_blocks: int
    demoted_blocks: int
    swapped_out_bytes: int
    swapped_in_bytes: int
    moved_in_seconds: float


class SwapObserver(Protocol):
    """Who learns the measured swap rate (the engine's PreemptionPolicy)."""

    def observe_swap(self, nbytes: int, seconds: float) -> None: ...


class NoHostTier:
    """No host tier: every move it would make is declined."""

    tiers: tuple[TierMemory, ...] = ()

    def promote(self, gpu: TierMemory, hashes: list[BlockHash], start: int) -> Promoted:
        return Promoted([])

    def swap_out(self, gpu: TierMemory, written: list[BlockId], full_hashes: list[BlockHash]
                 ) -> list[BlockId] | None:
        return None

    def swap_in(self, gpu: TierMemory, host_ids: list[BlockId], gpu_ids: list[BlockId]) -> None:
        assert not host_ids, "nothing is ever swapped out without a host tier"

    def release(self, host_ids: list[BlockId]) -> None:
        assert not host_ids, "nothing is ever swapped out without a host tier"


class HostTier(TierMemory):
    """The host tier of a node. Every move keeps the reference discipline of NodeMemory: what a
    failed move took is given back before it returns."""

    def __init__(self, layout: KVLayout, num_blocks: int, config: PoolConfig, counters: TierMoves,
                 policy: SwapObserver, clock: Callable[[], float] = time.monotonic, *,
                 disk: DiskTier | NoDiskTier | None = None) -> None:
        """`disk`: the tier under this one (None: none), which this tier's evicted prefix blocks go to."""
        self.disk = disk or NoDiskTier()
        self._spills = disk is not None
        super().__init__(layout, num_blocks, Tier.HOST, "cpu", config, clock,
                         on_evict=self._spill if disk is not None else None)
        self._block_bytes = layout.block_bytes
        self._counters = counters
        self._policy = policy
        self._clock = clock
        self.tiers: tuple[TierMemory, ...] = (self,)

    def promote(self, gpu: TierMemory, hashes: list[BlockHash], start: int) -> Promoted:
        """Copy this tier's cached run of hashes[start:] into fresh gpu blocks (inserted into the gpu
        cache and held once by the caller); when the host misses, the disk tier's run is read into
        the host first (and stays cached there), and the result says so. No blocks when both miss
        or the gpu has no room."""
        t0 = self._clock()
        try:
            return self._promote(gpu, hashes, start)
        finally:
            self._counters.moved_in_seconds += self._clock() - t0

    def _promote(self, gpu: TierMemory, hashes: list[BlockHash], start: int) -> Promoted:
        host_ids = self.cache.match(hashes[start:])
        from_disk = 0
        if not host_ids:
            host_ids = self._load_from_disk(hashes, start)
            from_disk = len(host_ids)
        if not host_ids:
            return Promoted([])
        try:
            gpu_ids = gpu.pool.allocate(len(host_ids))
        except OutOfBlocks:
            self.cache.release(host_ids)
            return Promoted([])
        copy_blocks(self, host_ids, gpu, gpu_ids)
        gpu.cache.insert(hashes[start: start + len(gpu_ids)], gpu_ids, hashes[start - 1] if start else None)
        self.cache.release(host_ids)
        self._counters.promoted_blocks += len(gpu_ids)
        return Promoted(gpu_ids, from_disk)

    def swap_out(self, gpu: TierMemory, written: list[BlockId], full_hashes: list[BlockHash]
                 ) -> list[BlockId] | None:
        """Host copies of `written` (held once by the caller; the first len(full_hashes) become
        host-cached under those hashes), or None when the host is full."""
        try:
            host_ids = self.pool.allocate(len(written))
        except OutOfBlocks:
            return None
        t0 = self._clock()
        copy_blocks(gpu, written, self, host_ids)
        self._policy.observe_swap(len(written) * self._block_bytes, self._clock() - t0)
        if full_hashes:
            self.cache.insert(full_hashes, host_ids[: len(full_hashes)], None)
        self._counters.swapped_out_bytes += len(written) * self._block_bytes
        return host_ids

    def swap_in(self, gpu: TierMemory, host_ids: list[BlockId], gpu_ids: list[BlockId]) -> None:
        """Copy a swapped sequence's blocks back into its new gpu blocks and drop its host copies."""
        t0 = self._clock()
        copy_blocks(self, host_ids, gpu, gpu_ids)
        self._counters.moved_in_seconds += self._clock() - t0
        self.cache.release(host_ids)
        self._counters.swapped_in_bytes += len(host_ids) * self._block_bytes

    def release(self, host_ids: list[BlockId]) -> None:
        self.cache.release(host_ids)

    def demote(self, gpu: TierMemory, evicted: Sequence[EvictedBlock]) -> None:
        """Copy gpu prefix blocks being evicted into this tier, where they stay matchable.

        Runs inside a gpu allocation while the evicted blocks still hold their KV, so it must not
        fail it: it takes only as many host blocks as the host can give (free, or cached ones its
        LRU evicts), keeping the chain heads, which come last because a chain's tail is evicted
        first. The tails it has no room for go straight to the disk tier (a host smaller than one
        eviction, as a disk tier's staging host is, would otherwise lose them). Hashes the host
        already holds are not copied again.
        """
        todo = [e for e in evicted if e.hash not in self.cache]
        room = self.pool.num_free + self.pool.num_cached
        if self._spills:
            self._spill(todo[: max(len(todo) - room, 0)], gpu)
        todo = todo[max(len(todo) - room, 0):]
        if not todo:
            return
        host_ids = self.pool.allocate(len(todo))
        copy_blocks(gpu, [e.block_id for e in todo], self, host_ids)
        # Reversed, a batch runs head to tail; consecutive links of one chain go in one insert.
        chain: list[tuple[EvictedBlock, BlockId]] = []
        for e, b in reversed(list(zip(todo, host_ids, strict=True))):
            if chain and e.parent != chain[-1][0].hash:
                _insert_chain(self.cache, chain)
                chain = []
            chain.append((e, b))
        _insert_chain(self.cache, chain)
        self.cache.release(host_ids)
        self._counters.demoted_blocks += len(todo)

    def _load_from_disk(self, hashes: list[BlockHash], start: int) -> list[BlockId]:
        """Read the disk tier's run of hashes[start:] into fresh host blocks (cached, and held once
        by the caller like a match); [] when the disk misses. Takes only the room the host has. The
        disk reads straight into the blocks; those past a record that fails to verify go back free."""
        room = self.pool.num_free + self.pool.num_cached
        run = hashes[start: start + self.disk.run_length(hashes[start: start + room])]
        if not run:
            return []
        host_ids = self.pool.allocate(len(run))
        served = self.disk.get_run_into(run, [self.kv[b].view(-1).view(torch.uint8).numpy().data for b in host_ids])
        if served < len(host_ids):
            self.pool.free(host_ids[served:])
            host_ids = host_ids[:served]
        if not host_ids:
            return []
        self.cache.insert(run[:served], host_ids, hashes[start - 1] if start else None)
        return host_ids

    def _spill(self, evicted: Sequence[EvictedBlock], source: TierMemory | None = None) -> None:
        """Hand prefix blocks being evicted from `source` (this tier by default) to the disk tier:
        their bytes are copied now, while the blocks still hold them, and written later by the
        disk's writer thread."""
        todo = [e for e in evicted if e.hash not in self.disk]
        if not todo:
            return
        buffer = kernels.gather_blocks((source or self).kv, [e.block_id for e in todo]).cpu()
        raw = buffer.view(len(todo), -1).view(torch.uint8).numpy()
        for e, row in zip(todo, raw, strict=True):
            self.disk.offer(e.hash, row.tobytes(), parent=e.parent)


PERSIST_BATCH = 64
"""Blocks gathered off a tier at once by `persist_resident`: one copy each, the deadline checked between."""


def persist_resident(tiers: Sequence[TierMemory], disk: DiskTier, clock: Callable[[], float] = time.monotonic
                     ) -> int:
    """Write every block `tiers` cache that `disk` lacks, waiting for the writer rather than dropping,
    for at most disk.persist_s; returns how many were handed over (closing the disk writes them).
    Only when nothing else uses the tiers (the engine thread has stopped).

    Colder tiers first (host, then gpu) and, within a tier, oldest first: the disk evicts its oldest
    segment first, so the hottest blocks are the last to go. Blocks past the disk's capacity would
    only evict the ones before them, so only the newest capacity_blocks are written."""
    if disk.persist_s <= 0:
        return 0
    deadline = clock() + disk.persist_s
    seen: set[BlockHash] = set()
    todo: list[tuple[TierMemory, EvictedBlock]] = []
    for tier in reversed(tiers):
        for b in tier.cache.blocks():
            if b.hash not in seen and b.hash not in disk:
                seen.add(b.hash)
                todo.append((tier, b))
    todo = todo[max(len(todo) - disk.capacity_blocks, 0):]
    handed = 0
    for i in range(0, len(todo), PERSIST_BATCH):
        if clock() >= deadline:
            log.warning("disk tier: stopped persisting after %.1f s: %d of %d cached blocks written",
                        disk.persist_s, handed, len(todo))
            break
        batch = todo[i: i + PERSIST_BATCH]
        for tier in {id(t): t for t, _ in batch}.values():
            mine = [b for t, b in batch if t is tier]
            raw = kernels.gather_blocks(tier.kv, [b.block_id for b in mine]).cpu()
            for b, row in zip(mine, raw.view(len(mine), -1).view(torch.uint8).numpy(), strict=True):
                handed += disk.write(b.hash, row.tobytes(), parent=b.parent, timeout_s=max(deadline - clock(), 0.0))
    return handed


def _insert_chain(cache: PrefixCache, chain: list[tuple[EvictedBlock, BlockId]]) -> None:
    cache.insert([e.hash for e, _ in chain], [b for _, b in chain], chain[0][0].parent)
