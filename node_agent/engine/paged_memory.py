"""The node's KV memory: the gpu tier, the optional host tier, and every block move between them.

`PagedMemory` is the engine's `BlockSpace`: prefix hits (gpu, then host or disk with promotion), adopted
external blocks, growth, swap out / in, insertion of computed blocks into the prefix cache, and
demotion of evicted gpu prefix blocks to the host tier (memory.tiers makes the host's moves).
Block tables are block_table.SequenceManager's. It stays the engine's (memory/ holds the tiers it
composes) because it works on the scheduler's SequenceState and the engine's preemption modes.
"""

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from radixmesh.common.block_pool.block_pool import BlockPool
from radixmesh.common.block_pool.config import PoolConfig, PoolHooks
from radixmesh.common.block_pool.counters import OutOfBlocks
from radixmesh.common.prefix_cache.block_table import BlockTable, SequenceManager
from radixmesh.node_agent.engine.metrics import EngineCounters
from radixmesh.node_agent.engine.preemption import PreemptionPolicy, PreemptMode
from radixmesh.node_agent.engine.request import PendingPrefix
from radixmesh.node_agent.engine.scheduler import SequenceState
from radixmesh.node_agent.memory.disk.record import DiskIdentity
from radixmesh.node_agent.memory.disk.tier import DiskConfig, DiskTier
from radixmesh.node_agent.memory.physical import StepPeakMeter, device_memory, process_resident_bytes
from radixmesh.node_agent.memory.tiers import HostTier, NoHostTier, TierMemory
from radixmesh.node_agent.memory.zones.governor import ZoneGovernor, ZoneSetup
from radixmesh.node_agent.memory.zones.metrics import physical_stats, zone_stats
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.events import Tier
from radixmesh.proto.ids import BlockId
from radixmesh.proto.kv_layout import KVLayout
from radixmesh.proto.serve.limits import usable_prefix_blocks
from radixmesh.proto.serve.tokens import TokenSources

STAGING_HOST_BLOCKS = 64
"""Host blocks of a disk tier configured without a host tier: disk reads reach the gpu through them in
runs of at most this many (the prefix match repeats until the run ends), and gpu evictions they
cannot take go straight to disk (memory.tiers.HostTier.demote). 128 MiB at Llama-3-8B's 2 MiB blocks."""


@dataclass(frozen=True, slots=True)
class MemoryConfig:
    """Sizes of the two tiers and whether prefixes are shared."""

    num_gpu_blocks: int = 512
    num_host_blocks: int = 0
    """0: no host tier (preemption always recomputes, no promotion)."""
    enable_prefix_caching: bool = True
    """False: nothing is matched or inserted (the "caching off" baseline)."""
    hash_key: bytes = b""
    """The cluster's block-hash key (block_hash.hash_blocks)."""
    demote_evicted: bool = True
    """Copy prefix blocks evicted from the gpu tier into the host tier (when there is one) instead
    of dropping them; the host tier's own LRU makes room."""
    pool: PoolConfig = field(default_factory=PoolConfig)
    zones: ZoneSetup = field(default_factory=ZoneSetup)
    """How the gpu pool is split between running KV and the prefix cache (memory/zones/governor.py)."""
    disk: DiskConfig | None = None
    """The disk tier under the host tier (memory.disk); without num_host_blocks it gets a host tier of
    STAGING_HOST_BLOCKS (`host_blocks`). None: none."""

    def __post_init__(self) -> None:
        if self.num_gpu_blocks < 1 or self.num_host_blocks < 0:
            raise ValueError(f"need num_gpu_blocks >= 1 and num_host_blocks >= 0, got "
                             f"{self.num_gpu_blocks}, {self.num_host_blocks}")

    @property
    def host_blocks(self) -> int:
        """The host tier's size: num_host_blocks, or STAGING_HOST_BLOCKS for a disk tier given none
        (disk reads land in the host tier; issue 40: users had to size one to get a disk tier)."""
        return self.num_host_blocks or (STAGING_HOST_BLOCKS if self.disk is not None else 0)


@dataclass(slots=True)
class PrefixHit:
    """The pinned gpu blocks of a sequence's matched prefix, and how many of them were promoted
    from the host tier and from the disk tier (the rest were already in the gpu)."""

    block_ids: list[BlockId]
    host_blocks: int = 0
    disk_blocks: int = 0


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


class PagedMemory:
    """The gpu and host tiers of one node, and the block moves the scheduler asks for.

    Reference discipline: a sequence holds one reference on every block of its table (gpu) or, while
    swapped out, of its host table; every path that fails gives back what it took before returning.
    """

    def __init__(self, layout: KVLayout, config: MemoryConfig, counters: EngineCounters,
                 policy: PreemptionPolicy, *, device: str | torch.device = "cpu",
                 clock: Callable[[], float] = time.monotonic, gpu_hooks: PoolHooks | None = None) -> None:
        """`gpu_hooks`: what the gpu pool calls out to (PoolHooks; the agent gives the cluster's recall)."""
        self.layout = layout
        self.config = config
        self.block_size = layout.block_size
        self.counters = counters
        self.policy = policy
        self._clock = clock
        self.disk: DiskTier | None = (DiskTier(config.disk, DiskIdentity.of(layout, config.hash_key))
                                      if config.disk is not None else None)
        host = (HostTier(layout, config.host_blocks, config.pool, counters, policy, clock, disk=self.disk)
                if config.host_blocks else None)
        demote = None
        if host is not None and config.demote_evicted:
            demote = lambda evicted: host.demote(self.gpu, evicted)
        self.host: HostTier | NoHostTier = host or NoHostTier()
        self.gpu: TierMemory = TierMemory(layout, config.num_gpu_blocks, Tier.GPU, device, config.pool, clock, demote,
                                          gpu_hooks)
        self.tiers: tuple[TierMemory, ...] = (self.gpu, *self.host.tiers)
        """The tiers this node has, gpu first."""
        self.sequences = SequenceManager(self.gpu.cache, self.block_size, key=config.hash_key)
        self.zones = ZoneGovernor(self.gpu.pool, config.zones, clock)
        """Weights, activations, running KV and prefix cache over the gpu tier's budget."""
        self._device = torch.device(device)
        self._meter = StepPeakMeter(self._device)
        self._pulls: dict[PendingPrefix, SequenceState] = {}
        """Pulls in flight, and the sequence each was begun for: their blocks are held here until they land."""

    # --- zones -------------------------------------------------------------------------------
    def begin_forward(self) -> None:
        """Start measuring a forward pass's activation peak."""
        self._meter.start()

    def end_forward(self) -> None:
        """The forward pass is over: its activations are reclaimed; record their measured peak and
        rebalance the kv and prefix zones."""
        self.zones.after_step(self._meter.stop())

    def zone_snapshots(self) -> list[object]:
        """Every zone's stats and the physical layer's, for the node's Prometheus exposition."""
        physical = physical_stats(process_resident_bytes(), device_memory(self._device), self.zones.activation_peak)
        return [*zone_stats(self.zones), physical]

    def blocks_for(self, num_tokens: int) -> int:
        return self.sequences.blocks_for(num_tokens)

    def new_sequence(self, tokens: Sequence[int], salt: bytes, hashes: Sequence[BlockHash] = ()) -> BlockTable:
        """The block table of a new request, holding no block until admitted; `hashes`: its leading
        full blocks' hashes when the caller has them (Request.prompt_hashes)."""
        return self.sequences.create(tokens, salt=salt, hashes=hashes)

    # --- external prefix -----------------------------------------------------------------------
    def adopt_external(self, seq: SequenceState, block_ids: Sequence[BlockId],
                       hashes: Sequence[BlockHash], start: int) -> None:
        """Take over the caller's reference on external blocks holding prompt blocks start.. : they
        become cached gpu blocks, matched at admission like local hits (or evicted under pressure,
        then recomputed: correct, only slower)."""
        parent = self.sequences.block_hashes(seq.table, start)[-1] if start else None
        self._adopt(block_ids, hashes, parent, seq)

    def begin_pull(self, seq: SequenceState, pull: PendingPrefix) -> None:
        """Fill in `pull` (see PendingPrefix): the blocks of [0, pull.end_block) this tier lacks
        after its longest cached prefix get fresh blocks, as many as fit. Nothing is pulled when
        prefixes are not cached (nothing would match what arrives)."""
        if not self.config.enable_prefix_caching:
            return
        hashes = self.sequences.block_hashes(seq.table, pull.end_block)
        start = self.gpu.cache.longest_prefix(hashes)
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
               seq: SequenceState) -> None:
        if self.config.enable_prefix_caching:
            self.gpu.cache.insert(hashes, block_ids, parent)
            seq.external_hashes = frozenset(hashes)
        self.gpu.cache.release(block_ids)

    # --- BlockSpace --------------------------------------------------------------------------
    def admit(self, seq: SequenceState, budget: int) -> int:
        if seq.is_swapped:
            return self._swap_in(seq, budget)
        assert seq.num_computed == 0 and not seq.block_ids, seq
        table = seq.table
        hit = self._match_prefix(seq)
        self.sequences.attach_prefix(table, hit.block_ids)
        computed = table.num_cached_blocks * self.block_size
        n = min(len(seq.tokens) - computed, budget)
        try:
            self.sequences.reserve(table, computed + n)
        except OutOfBlocks:
            self.sequences.drop_blocks(table)
            return 0
        seq.num_computed = computed
        self._count_hits(seq, hit, table.num_cached_blocks)
        return n

    def grow(self, seq: SequenceState, num_tokens: int) -> bool:
        try:
            self.sequences.reserve(seq.table, num_tokens)
        except OutOfBlocks:
            return False
        return True

    def preempt(self, seq: SequenceState, mode: PreemptMode) -> PreemptMode:
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
    def insert_computed(self, seq: SequenceState) -> None:
        """Offer the sequence's newly completed full blocks to the gpu prefix cache."""
        if self.config.enable_prefix_caching:
            self.sequences.commit(seq.table, seq.num_computed)

    def release(self, seq: SequenceState) -> None:
        """Give back every block a finished (or aborted) sequence holds, on both tiers."""
        self.sequences.release(seq.table)
        if seq.host_block_ids:
            self.host.release(seq.host_block_ids)
            seq.host_block_ids = []

    def check_invariants(self) -> None:
        for tier in self.tiers:
            tier.cache.check_invariants()

    # --- moves -------------------------------------------------------------------------------
    def _match_prefix(self, seq: SequenceState) -> PrefixHit:
        """Pinned gpu blocks of the longest reusable prefix: gpu hits, then host (or, through the
        host, disk) hits promoted to the gpu, alternating while either advances. The last prompt
        token is always left to compute, because its logits are what the first sampled token needs."""
        hit = PrefixHit([])
        if not self.config.enable_prefix_caching:
            return hit
        limit = usable_prefix_blocks(len(seq.tokens), self.block_size)
        hashes = self.sequences.block_hashes(seq.table, limit)
        while len(hit.block_ids) < limit:
            got = self.gpu.cache.match(hashes[len(hit.block_ids):])
            if not got:
                promoted = self.host.promote(self.gpu, hashes, len(hit.block_ids))
                got = promoted.block_ids
                hit.disk_blocks += promoted.from_disk
                hit.host_blocks += len(got) - promoted.from_disk
            if not got:
                break
            hit.block_ids += got
        return hit

    def _count_hits(self, seq: SequenceState, hit: PrefixHit, num_blocks: int) -> None:
        """The request's prompt tokens by source, set once (at its first admission): of its
        `num_blocks` cached blocks, those promoted from host or disk, those pulled or adopted
        (external), and the rest found in the gpu tier."""
        if seq.stats.sources is not None:
            return
        bs = self.block_size
        external = sum(1 for h in seq.table.hashes[:num_blocks] if h in seq.external_hashes)
        local_gpu = num_blocks - hit.host_blocks - hit.disk_blocks - external
        seq.stats.sources = TokenSources.of_prompt(
            seq.stats.prompt_tokens, local_gpu=local_gpu * bs, local_host=hit.host_blocks * bs,
            local_disk=hit.disk_blocks * bs, remote=external * bs)

    def _swap_out(self, seq: SequenceState, written: list[BlockId]) -> list[BlockId] | None:
        """Host copies of `written` (hashed full blocks also become host-cached), or None when the
        host tier is absent or full."""
        if not written:
            return None
        full = min(seq.num_computed // self.block_size, len(written))
        cached = self.config.enable_prefix_caching and full
        return self.host.swap_out(self.gpu, written, self.sequences.block_hashes(seq.table, full) if cached else [])

    def _swap_in(self, seq: SequenceState, budget: int) -> int:
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
