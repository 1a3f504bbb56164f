"""The node's KV memory behind one door (as vLLM's KVCacheManager between its scheduler and block pool).

`NodeMemory` is the scheduler's `BlockSpace`: prefix hits (memory.prefix_match: gpu, then host or
disk with promotion), adopted external blocks, growth, swap out / in, insertion of computed blocks
into the prefix cache, and demotion of evicted gpu prefix blocks to the host tier (memory.tiers
makes the host's moves). It is also the agent's one handle on memory: what the node announces
(capacity, events, snapshot), its load, the reset and the clean close. It sees a sequence as
memory.sequence.SequenceBlocks, so memory never imports the engine."""

import time
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

import torch

from radixmesh.common.block_pool.block_pool import BlockPool
from radixmesh.common.block_pool.config import PoolHooks
from radixmesh.common.block_pool.counters import OutOfBlocks
from radixmesh.common.prefix_cache.block_table import BlockTable, SequenceManager
from radixmesh.common.prefix_cache.prefix_cache import PrefixCache
from radixmesh.node_agent.memory.config import MemoryConfig
from radixmesh.node_agent.memory.disk.metrics import DiskStats
from radixmesh.node_agent.memory.disk.record import DiskIdentity
from radixmesh.node_agent.memory.disk.tier import ANNOUNCED_BLOCKS, DiskTier, NoDiskTier
from radixmesh.node_agent.memory.metrics import memory_stats
from radixmesh.node_agent.memory.physical import StepPeakMeter, device_memory, process_resident_bytes
from radixmesh.node_agent.memory.prefix_match import count_sources, match_prefix
from radixmesh.node_agent.memory.sequence import PendingPrefix, PreemptMode, SequenceBlocks
from radixmesh.node_agent.memory.tiers import (
    HostTier,
    NoHostTier,
    SwapObserver,
    TierMemory,
    TierMoves,
    persist_resident,
)
from radixmesh.node_agent.memory.zones.governor import ZoneGovernor
from radixmesh.node_agent.memory.zones.metrics import physical_stats, zone_stats
from radixmesh.proto.block_hash import BlockHash, hash_blocks
from radixmesh.proto.events import BlockStored, CacheEvent, Tier, chains
from radixmesh.proto.ids import BlockId
from radixmesh.proto.kv_layout import KVLayout
from radixmesh.proto.serve.limits import usable_prefix_blocks


class BlockCounts(NamedTuple):
    """A tier's blocks by state, adding up to its size: `free`, `cached` (hashed and held by no one:
    evictable) and `in_use` (held by a sequence, a pull or a caller)."""

    free: int
    cached: int
    in_use: int


def allocate_up_to(pool: BlockPool, n: int) -> list[BlockId]:
    """Up to `n` fresh blocks (ref 1, no hash): all of them when they fit, else as many as the pool
    can still give, possibly none. Pulls allocate this way before asking, so a pull never stalls
    mid-stream for space; the owner is told how many fit."""
    try:
        return pool.allocate(n)
    except OutOfBlocks:
        room = min(n, pool.num_free + pool.num_cached)
        try:
            return pool.allocate(room) if room else []
        except OutOfBlocks:  # the kv zone's limit, not the pool's size
            return []


class NodeMemory:
    """The gpu, host and disk tiers of one node, the block moves the scheduler asks for, and what
    the agent reads of them. Not thread-safe: call it on the thread that steps the engine.

    Reference discipline: a sequence holds one reference on every block of its table (gpu) or, while
    swapped out, of its host table; every path that fails gives back what it took before returning.
    """

    def __init__(self, layout: KVLayout, config: MemoryConfig, counters: TierMoves,
                 policy: SwapObserver, *, device: str | torch.device = "cpu",
                 clock: Callable[[], float] = time.monotonic, gpu_hooks: PoolHooks | None = None,
                 weights_bytes: int = 0) -> None:
        """`counters` and `policy`: where the host tier counts its moves and reports swap rates (the
        engine's EngineCounters and PreemptionPolicy); `gpu_hooks`: what the gpu pool calls out to
        (PoolHooks; the agent gives the cluster's recall); `weights_bytes`: the model's parameter
        bytes (the weights zone)."""
        self.layout = layout
        self.config = config
        self.block_size = layout.block_size
        self.counters = counters
        self.policy = policy
        self._clock = clock
        disk = DiskTier(config.disk, DiskIdentity.of(layout, config.hash_key)) if config.disk is not None else None
        host = (HostTier(layout, config.host_blocks, config.pool, counters, policy, clock, disk=disk)
                if config.host_blocks else None)
        self.disk: DiskTier | NoDiskTier = disk or NoDiskTier()
        demote = None
        if host is not None and config.demote_evicted:
            demote = lambda evicted: host.demote(self.gpu, evicted)
        self.host: HostTier | NoHostTier = host or NoHostTier()
        self.gpu: TierMemory = TierMemory(layout, config.num_gpu_blocks, Tier.GPU, device, config.pool, clock, demote,
                                          gpu_hooks)
        self.tiers: tuple[TierMemory, ...] = (self.gpu, *self.host.tiers)
        """The tiers this node has, gpu first."""
        self._event_sources: tuple[PrefixCache | DiskTier | NoDiskTier, ...] = (
            *(t.cache for t in self.tiers), self.disk)
        """Every emitter of index events, in drain order: take_events and has_events ask the same ones."""
        self.sequences = SequenceManager(self.gpu.cache, self.block_size, key=config.hash_key)
        self.zones = ZoneGovernor(self.gpu.pool, config.zones, clock)
        """Weights, activations, running KV and prefix cache over the gpu tier's budget."""
        self.zones.set_weights_bytes(weights_bytes)
        self._device = torch.device(device)
        self._meter = StepPeakMeter(self._device)
        self._pulls: dict[PendingPrefix, SequenceBlocks] = {}
        """Pulls in flight, and the sequence each was begun for: their blocks are held here until they land."""

    # --- zones -------------------------------------------------------------------------------
    def begin_forward(self) -> None:
        """Start measuring a forward pass's activation peak."""
        self._meter.start()

    def end_forward(self) -> None:
        """The forward pass is over: its activations are reclaimed; record their measured peak and
        rebalance the kv and prefix zones."""
        self.zones.after_step(self._meter.stop())

    @property
    def kv(self) -> torch.Tensor:
        """The gpu tier's KV tensor, which the forward pass reads and writes."""
        return self.gpu.kv

    @property
    def num_gpu_blocks(self) -> int:
        return self.config.num_gpu_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return self.sequences.blocks_for(num_tokens)

    def new_sequence(self, tokens: Sequence[int], salt: bytes, hashes: Sequence[BlockHash] = ()) -> BlockTable:
        """The block table of a new request, holding no block until admitted; `hashes`: its leading
        full blocks' hashes when the caller has them (Request.prompt_hashes)."""
        return self.sequences.create(tokens, salt=salt, hashes=hashes)

    # --- external prefix -----------------------------------------------------------------------
    def holds_external(self, block_ids: Sequence[BlockId], hashes: Sequence[BlockHash]) -> bool:
        """Whether `block_ids` are distinct gpu blocks the caller holds, none cached under another
        hash than its own in `hashes` (what adopt_external may take over)."""
        pool = self.gpu.pool
        return len(set(block_ids)) == len(block_ids) and all(
            0 <= b < pool.num_blocks and pool.ref_count(b) >= 1 and pool.hash_of(b) in (None, h)
            for b, h in zip(block_ids, hashes, strict=True))

    def adopt_external(self, seq: SequenceBlocks, block_ids: Sequence[BlockId],
                       hashes: Sequence[BlockHash], start: int) -> None:
        """Take over the caller's reference on external blocks holding prompt blocks start.. : they
        become cached gpu blocks, matched at admission like local hits (or evicted under pressure,
        then recomputed: correct, only slower)."""
        parent = self.sequences.block_hashes(seq.table, start)[-1] if start else None
        self._adopt(block_ids, hashes, parent, seq)

    def begin_pull(self, seq: SequenceBlocks, pull: PendingPrefix) -> None:
        """Fill in `pull` (see PendingPrefix): the blocks of [0, pull.end_block) this tier lacks
        after its longest cached prefix get fresh blocks, as many as fit. Nothing is pulled when
        prefixes are not cached (nothing would match what arrives)."""
        if not self.config.enable_prefix_caching:
            return
        hashes = self.sequences.block_hashes(seq.table, pull.end_block)
        start = self.cached_prefix(Tier.GPU, hashes)
        pull.start, pull.hashes = start, tuple(hashes[start:])
        pull.parent = hashes[start - 1] if start else None
        pull.block_ids = tuple(allocate_up_to(self.gpu.pool, len(pull.hashes)))
        if pull.block_ids:
            self._pulls[pull] = seq
            seq.pulling = pull

    def land_pull(self, pull: PendingPrefix, received: int) -> None:
        """The first `received` blocks of `pull` hold their KV: they become cached like adopted
        external blocks (its sequence's remote hits, and it may be admitted); the rest go back to
        the pool. The sequence may have been released meanwhile: the blocks stay cached then. A
        pull that got no blocks lands as nothing."""
        seq = self._pulls.pop(pull, None)
        if seq is None:
            assert not pull.block_ids, "a pull landed twice"
            return
        self.gpu.pool.free(pull.block_ids[received:])
        self._adopt(pull.block_ids[:received], pull.hashes[:received], pull.parent, seq)
        seq.pulling = None

    @property
    def pulling_blocks(self) -> int:
        """Blocks held for pulls in flight (begun, not landed)."""
        return sum(len(p.block_ids) for p in self._pulls)

    def _adopt(self, block_ids: Sequence[BlockId], hashes: Sequence[BlockHash], parent: BlockHash | None,
               seq: SequenceBlocks) -> None:
        if self.config.enable_prefix_caching:
            self.gpu.cache.insert(hashes, block_ids, parent)
            seq.external_hashes = frozenset(hashes)
        self.gpu.cache.release(block_ids)

    # --- BlockSpace --------------------------------------------------------------------------
    def admit(self, seq: SequenceBlocks, budget: int) -> int:
        if seq.is_swapped:
            return self._swap_in(seq, budget)
        assert seq.num_computed == 0 and not seq.block_ids, seq
        table = seq.table
        # The last prompt token is always computed: its logits are what the first sampled token needs.
        usable = usable_prefix_blocks(len(seq.tokens), self.block_size) if self.config.enable_prefix_caching else 0
        hit = match_prefix(self.gpu, self.host, self.sequences.block_hashes(table, usable))
        self.sequences.attach_prefix(table, hit.block_ids)
        computed = table.num_cached_blocks * self.block_size
        n = min(len(seq.tokens) - computed, budget)
        try:
            self.sequences.reserve(table, computed + n)
        except OutOfBlocks:
            self.sequences.drop_blocks(table)
            return 0
        seq.num_computed = computed
        count_sources(seq, hit, table.num_cached_blocks, self.block_size)
        return n

    def grow(self, seq: SequenceBlocks, num_tokens: int) -> bool:
        try:
            self.sequences.reserve(seq.table, num_tokens)
        except OutOfBlocks:
            return False
        return True

    def preempt(self, seq: SequenceBlocks, mode: PreemptMode) -> PreemptMode:
        used = mode
        swapped_bytes = 0
        written = seq.block_ids[: self.blocks_for(seq.num_computed)]
        if mode is PreemptMode.SWAP:
            host_ids = self._swap_out(seq, written)
            if host_ids is None:
                used = PreemptMode.RECOMPUTE
            else:
                seq.host_block_ids = host_ids
                swapped_bytes = len(host_ids) * self.layout.block_bytes
        if used is PreemptMode.RECOMPUTE:
            seq.num_computed = 0
        self.sequences.drop_blocks(seq.table)
        self.gpu.pool.record_preemption(swapped_bytes)
        return used

    # --- after a forward pass ----------------------------------------------------------------
    def uncomputed_hashes(self, seq: SequenceBlocks) -> list[BlockHash]:
        """The hashes of `seq`'s full blocks whose KV it has not computed yet (none without prefix
        caching): a waiting sequence sharing one waits for it (Scheduler)."""
        if not self.config.enable_prefix_caching:
            return []
        full = len(seq.tokens) // self.block_size
        return self.sequences.block_hashes(seq.table, full)[seq.num_computed // self.block_size:]

    def insert_computed(self, seq: SequenceBlocks) -> None:
        """Offer the sequence's newly completed full blocks to the gpu prefix cache."""
        if self.config.enable_prefix_caching:
            self.sequences.commit(seq.table, seq.num_computed)

    def release(self, seq: SequenceBlocks) -> None:
        """Give back every block a finished (or aborted) sequence holds, on both tiers."""
        self.sequences.release(seq.table)
        if seq.host_block_ids:
            self.host.release(seq.host_block_ids)
            seq.host_block_ids = []

    def check_invariants(self, sequences: Iterable[SequenceBlocks] = ()) -> None:
        """Every tier's invariants, plus: every reference held on a block is one of `sequences`' (the
        live ones) or a pull's, so a finished or preempted request can leak nothing."""
        for tier in self.tiers:
            tier.cache.check_invariants()
        seqs = list(sequences)
        held = sum(len(s.block_ids) for s in seqs) + self.pulling_blocks
        refs = sum(self.gpu.pool.ref_counts())
        assert refs == held, f"gpu refs {refs} != {held} held by {len(seqs)} active sequences and pulls"
        held = sum(len(s.host_block_ids) for s in seqs)
        refs = sum(sum(t.pool.ref_counts()) for t in self.host.tiers)
        assert refs == held, f"host refs {refs} != {held} held by swapped sequences"

    # --- what the agent reads and does --------------------------------------------------------
    def hash_prompt(self, tokens: Sequence[int], salt: bytes) -> list[BlockHash]:
        """The chained hashes of the full blocks of `tokens` under `salt` and this node's hash key."""
        return hash_blocks(tokens, self.block_size, salt=salt, key=self.config.hash_key)

    @property
    def tier_blocks(self) -> int:
        """Blocks of the gpu and host tiers together."""
        return sum(t.pool.num_blocks for t in self.tiers)

    @property
    def free_blocks(self) -> int:
        """Gpu blocks an allocation may take: free, or cached and evictable."""
        return self.gpu.pool.num_free + self.gpu.pool.num_cached

    def block_counts(self, tier: Tier) -> BlockCounts:
        """The gpu or host tier's blocks by state (all 0 for a host tier this node lacks)."""
        pool = self._pool(tier)
        return BlockCounts(pool.num_free, pool.num_cached, pool.num_in_use) if pool else BlockCounts(0, 0, 0)

    def cached_prefix(self, tier: Tier, hashes: Sequence[BlockHash]) -> int:
        """How many of `hashes`, from the first, `tier` holds now (the disk's written or queued
        blocks), 0 on a tier this node lacks; pins nothing and counts no query."""
        if tier is Tier.DISK:
            return self.disk.run_length(hashes)
        return next((t.cache.longest_prefix(hashes) for t in self.tiers if t.cache.tier is tier), 0)

    def evict(self, tier: Tier, n: int | None = None) -> int:
        """Evict `n` (every one when None) of the gpu or host tier's cached blocks in its eviction
        order, as memory pressure would: the gpu's go down to the host on their way out when it
        demotes, the host's to disk. Held blocks stay. Returns how many were evicted."""
        pool = self._pool(tier)
        if pool is None:
            return 0
        return pool.evict(pool.num_cached if n is None else n)

    def _pool(self, tier: Tier) -> BlockPool | None:
        if tier is Tier.DISK:  # no pool: it writes and evicts segments on its own thread
            raise ValueError("the disk tier has no block pool: see disk_stats and reset_prefix_cache")
        return next((t.pool for t in self.tiers if t.pool.tier is tier), None)

    def flush_disk(self) -> None:
        """Return once the disk tier has written every block offered to it so far (at once without
        one): what it holds and counts is settled then."""
        self.disk.flush()

    def disk_stats(self) -> DiskStats | None:
        """The disk tier's size and counters now, None without a disk tier."""
        return self.disk.stats()

    def disk_read_bytes_per_s(self) -> float:
        """The disk tier's measured read rate (0.0 without a disk tier)."""
        return self.disk.read_bytes_per_s()

    def capacity(self) -> int:
        """What the node declares it may cache (NodeInfo): every tier's blocks, the disk's up to what
        it announces; the index refuses a node holding more than it declared."""
        return self.tier_blocks + min(self.disk.capacity_blocks, ANNOUNCED_BLOCKS)

    def take_events(self) -> list[CacheEvent]:
        """Every tier's events since the last call, gpu first, then what reached or left the disk
        (the disk publishes its own changes between snapshots, while it holds at most ANNOUNCED_BLOCKS)."""
        return [e for source in self._event_sources for e in source.take_events()]

    def has_events(self) -> bool:
        """Whether take_events has any to return. Unlike the rest of NodeMemory, callable from any
        thread (each source's answer is one atomic read): the agent asks it on its event loop, so
        that an idle node's publisher drains nothing without a job on the engine thread. A False
        gone stale as it returns (a step or the disk writer adding events meanwhile) only leaves
        them for the next drain."""
        return any(source.has_events() for source in self._event_sources)

    def disk_writing(self) -> bool:
        """Whether the disk writer still has offered blocks to write: the one source of events that
        adds them outside the engine's jobs. Callable from any thread, as has_events."""
        return self.disk.writing()

    def snapshot(self) -> tuple[BlockStored, ...]:
        """Every cached block of the gpu and host tiers as chains, and the disk tier's newest
        ANNOUNCED_BLOCKS (how a restarted node's disk blocks reach the index under its new
        epoch); drain the events first, so that the snapshot covers what they said."""
        stored = [c for t in self.tiers for c in chains(t.cache.snapshot(), t.cache.tier)]
        return (*stored, *chains(self.disk.chains(ANNOUNCED_BLOCKS), Tier.DISK))

    def stats_snapshots(self) -> list[object]:
        """Every tier's, the disk's, every zone's and the physical layer's stats, for the node's
        Prometheus exposition."""
        snaps: list[object] = [memory_stats(t.pool, t.cache) for t in self.tiers]
        if (disk := self.disk_stats()) is not None:
            snaps.append(disk)
        physical = physical_stats(process_resident_bytes(), device_memory(self._device), self.zones.activation_peak)
        return [*snaps, *zone_stats(self.zones), physical]

    def reset_prefix_cache(self) -> dict[str, int]:
        """Evict every cached block (hashed, no reference) of every tier; blocks a request or a peer's
        pull holds stay, and stay matchable. Returns the cached blocks dropped per tier ("gpu",
        "host", "disk"). The evictions emit BlockRemoved like any other, so the index follows.

        The gpu tier goes first: its evictions are demoted to the host on their way out (the
        eviction hook cannot be bypassed), the host's pass then drops those copies too (spilling
        them to disk), and the disk goes last, so the counts are what each tier held before the
        reset and no copy outlives it, not even in a restart's re-index (issue 38)."""
        tiers, disk = self.tiers, self.disk
        dropped = {t.pool.tier.value: t.pool.num_cached for t in tiers}
        if isinstance(disk, DiskTier):
            disk.flush()  # what the host spilled before the reset counts as the disk's
            dropped["disk"] = len(disk.store)
        for t in tiers:
            self.evict(t.pool.tier)
        assert all(t.pool.num_cached == 0 for t in tiers), "a cached block survived the reset"
        if isinstance(disk, DiskTier):
            disk.clear()
            assert len(disk.store) == 0, "a disk block survived the reset"
        return dropped

    def close(self) -> None:
        """On a clean stop, after the engine thread (no offer comes after the disk writer's last
        flush): write what the gpu and host tiers cache and the disk lacks, so a restart over the
        same disk is warm, then close the disk tier. Nothing to do without one."""
        if isinstance(self.disk, DiskTier):
            persist_resident(self.tiers, self.disk)
            self.disk.close()

    # --- moves -------------------------------------------------------------------------------
    def _swap_out(self, seq: SequenceBlocks, written: list[BlockId]) -> list[BlockId] | None:
        """Host copies of `written` (hashed full blocks also become host-cached), or None when the
        host tier is absent or full."""
        if not written:
            return None
        full = min(seq.num_computed // self.block_size, len(written))
        cached = self.config.enable_prefix_caching and full
        return self.host.swap_out(self.gpu, written, self.sequences.block_hashes(seq.table, full) if cached else [])

    def _swap_in(self, seq: SequenceBlocks, budget: int) -> int:
        assert not seq.block_ids
        n = min(seq.num_uncomputed, budget)
        try:
            self.sequences.reserve(seq.table, seq.num_computed + n)
        except OutOfBlocks:
            return 0
        host_ids = seq.host_block_ids
        self.host.swap_in(self.gpu, host_ids, seq.block_ids[: len(host_ids)])
        seq.host_block_ids = []
        return n
