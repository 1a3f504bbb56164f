"""The node's KV memory: the gpu tier, the optional host tier, and every block move between them.

`PagedMemory` is the engine's `BlockSpace`: prefix hits (gpu, then host with promotion), adopted
external blocks, growth, swap out / in, insertion of computed blocks into the prefix cache, and
demotion of evicted gpu prefix blocks to the host tier. Block tables are sequence.SequenceManager's.
"""

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from radixmesh import kernels
from radixmesh.node_agent.engine.metrics import EngineCounters
from radixmesh.node_agent.engine.preemption import PreemptionPolicy, PreemptMode
from radixmesh.node_agent.engine.scheduler import SequenceState
from radixmesh.node_agent.memory.block_pool import BlockPool, OutOfBlocks
from radixmesh.node_agent.memory.block_table import BlockTable, SequenceManager
from radixmesh.node_agent.memory.pool_config import PoolConfig
from radixmesh.node_agent.memory.prefix_cache import EvictedBlock, EvictionHook, PrefixCache
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.events import Tier
from radixmesh.proto.ids import BlockId
from radixmesh.proto.kv_layout import KVLayout
from radixmesh.proto.serve.limits import usable_prefix_blocks
from radixmesh.proto.serve.tokens import TokenSources

logger = logging.getLogger(__name__)


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

    def __post_init__(self) -> None:
        if self.num_gpu_blocks < 1 or self.num_host_blocks < 0:
            raise ValueError(f"need num_gpu_blocks >= 1 and num_host_blocks >= 0, got "
                             f"{self.num_gpu_blocks}, {self.num_host_blocks}")


class TierMemory:
    """One tier: a pool, its prefix cache, and the cache tensor the pool's block ids index."""

    def __init__(self, layout: KVLayout, num_blocks: int, tier: Tier, device: str | torch.device,
                 config: PoolConfig, clock: Callable[[], float], on_evict: EvictionHook | None = None) -> None:
        self.kv = layout.new_cache(num_blocks, device)
        self.pool = BlockPool(num_blocks, tier=tier, block_bytes=layout.block_bytes, config=config, clock=clock)
        self.cache = PrefixCache(self.pool, on_evict=on_evict)


def copy_blocks(src: TierMemory, src_ids: Sequence[BlockId], dst: TierMemory, dst_ids: Sequence[BlockId]) -> None:
    """Copy whole blocks (every layer, K and V) between tiers: one gather, one scatter."""
    buffer = kernels.gather_blocks(src.kv, src_ids)
    kernels.scatter_blocks(buffer.to(dst.kv.device), dst.kv, dst_ids)


class PagedMemory:
    """The gpu and host tiers of one node, and the block moves the scheduler asks for.

    Reference discipline: a sequence holds one reference on every block of its table (gpu) or, while
    swapped out, of its host table; every path that fails gives back what it took before returning.
    """

    def __init__(self, layout: KVLayout, config: MemoryConfig, counters: EngineCounters,
                 policy: PreemptionPolicy, *, device: str | torch.device = "cpu",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.layout = layout
        self.config = config
        self.block_size = layout.block_size
        self.counters = counters
        self.policy = policy
        self._clock = clock
        self.host = (TierMemory(layout, config.num_host_blocks, Tier.HOST, "cpu", config.pool, clock)
                     if config.num_host_blocks else None)
        demote = self._demote if self.host is not None and config.demote_evicted else None
        self.gpu = TierMemory(layout, config.num_gpu_blocks, Tier.GPU, device, config.pool, clock, demote)
        self.sequences = SequenceManager(self.gpu.cache, self.block_size, key=config.hash_key)

    def blocks_for(self, num_tokens: int) -> int:
        return self.sequences.blocks_for(num_tokens)

    def new_sequence(self, tokens: Sequence[int], salt: bytes) -> BlockTable:
        """The block table of a new request, holding no block until admitted."""
        return self.sequences.create(tokens, salt=salt)

    # --- external prefix -----------------------------------------------------------------------
    def adopt_external(self, seq: SequenceState, block_ids: Sequence[BlockId],
                       hashes: Sequence[BlockHash], start: int) -> None:
        """Take over the caller's reference on external blocks holding prompt blocks start.. : they
        become cached gpu blocks, matched at admission like local hits (or evicted under pressure,
        then recomputed: correct, only slower)."""
        if self.config.enable_prefix_caching:
            parent = self.sequences.block_hashes(seq.table, start)[-1] if start else None
            self.gpu.cache.insert(hashes, block_ids, parent)
            seq.external_hashes = frozenset(hashes)
        self.gpu.cache.release(block_ids)

    # --- BlockSpace --------------------------------------------------------------------------
    def admit(self, seq: SequenceState, budget: int) -> int:
        if seq.is_swapped:
            return self._swap_in(seq, budget)
        assert seq.num_computed == 0 and not seq.block_ids, seq
        table = seq.table
        self.sequences.attach_prefix(table, self._match_prefix(seq))
        computed = table.num_cached_blocks * self.block_size
        n = min(len(seq.tokens) - computed, budget)
        try:
            self.sequences.reserve(table, computed + n)
        except OutOfBlocks:
            self.sequences.drop_blocks(table)
            return 0
        seq.num_computed = computed
        self._count_hits(seq, table.num_cached_blocks)
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
            assert self.host is not None
            self.host.cache.release(seq.host_block_ids)
            seq.host_block_ids = []

    def check_invariants(self) -> None:
        self.gpu.cache.check_invariants()
        if self.host is not None:
            self.host.cache.check_invariants()

    # --- moves -------------------------------------------------------------------------------
    def _match_prefix(self, seq: SequenceState) -> list[BlockId]:
        """Pinned gpu blocks of the longest reusable prefix: gpu hits, then host hits promoted to
        the gpu, alternating while either advances. The last prompt token is always left to compute,
        because its logits are what the first sampled token needs."""
        if not self.config.enable_prefix_caching:
            return []
        limit = usable_prefix_blocks(len(seq.tokens), self.block_size)
        hashes = self.sequences.block_hashes(seq.table, limit)
        blocks: list[BlockId] = []
        seq.host_hit_blocks = 0
        while len(blocks) < limit:
            got = self.gpu.cache.match(hashes[len(blocks):])
            if not got:
                got = self._promote(hashes, len(blocks))
                seq.host_hit_blocks += len(got)
            if not got:
                break
            blocks += got
        return blocks

    def _promote(self, hashes: list[BlockHash], start: int) -> list[BlockId]:
        """Copy the host tier's cached run of hashes[start:] into fresh gpu blocks (inserted into the
        gpu cache and held once by the caller); [] when the host misses or the gpu has no room."""
        if self.host is None:
            return []
        host_ids = self.host.cache.match(hashes[start:])
        if not host_ids:
            return []
        try:
            gpu_ids = self.gpu.pool.allocate(len(host_ids))
        except OutOfBlocks:
            self.host.cache.release(host_ids)
            return []
        copy_blocks(self.host, host_ids, self.gpu, gpu_ids)
        self.gpu.cache.insert(hashes[start: start + len(gpu_ids)], gpu_ids, hashes[start - 1] if start else None)
        self.host.cache.release(host_ids)
        self.counters.promoted_blocks += len(gpu_ids)
        return gpu_ids

    def _count_hits(self, seq: SequenceState, num_blocks: int) -> None:
        if seq.stats.sources is not None:
            return
        bs = self.block_size
        host = seq.host_hit_blocks
        external = sum(1 for h in seq.table.hashes[:num_blocks] if h in seq.external_hashes)
        seq.stats.sources = TokenSources.of_prompt(
            seq.stats.prompt_tokens, local_gpu=(num_blocks - host - external) * bs, local_host=host * bs,
            remote=external * bs)

    def _swap_out(self, seq: SequenceState, written: list[BlockId]) -> list[BlockId] | None:
        """Host copies of `written` (hashed full blocks also become host-cached), or None when the
        host tier is absent or full."""
        if self.host is None or not written:
            return None
        try:
            host_ids = self.host.pool.allocate(len(written))
        except OutOfBlocks:
            return None
        t0 = self._clock()
        copy_blocks(self.gpu, written, self.host, host_ids)
        self.policy.observe_swap(len(written) * self.layout.block_bytes, self._clock() - t0)
        full = min(seq.num_computed // self.block_size, len(host_ids))
        if self.config.enable_prefix_caching and full:
            hashes = self.sequences.block_hashes(seq.table, full)
            self.host.cache.insert(hashes, host_ids[:full], None)
        self.counters.swapped_out_bytes += len(written) * self.layout.block_bytes
        return host_ids

    def _swap_in(self, seq: SequenceState, budget: int) -> int:
        assert self.host is not None and not seq.block_ids
        n = min(seq.num_uncomputed, budget)
        try:
            self.sequences.reserve(seq.table, seq.num_computed + n)
        except OutOfBlocks:
            return 0
        host_ids = seq.host_block_ids
        copy_blocks(self.host, host_ids, self.gpu, seq.block_ids[: len(host_ids)])
        self.host.cache.release(host_ids)
        self.counters.swapped_in_bytes += len(host_ids) * self.layout.block_bytes
        seq.host_block_ids = []
        return n

    def _demote(self, evicted: Sequence[EvictedBlock]) -> None:
        """Copy gpu prefix blocks being evicted into the host tier, where they stay matchable.

        Runs inside a gpu allocation while the evicted blocks still hold their KV, so it must not
        fail it: it takes only as many host blocks as the host can give (free, or cached ones its
        LRU evicts), keeping the chain heads, which come last because a chain's tail is evicted
        first. Hashes the host already holds are not copied again.
        """
        host = self.host
        assert host is not None
        todo = [e for e in evicted if e.hash not in host.cache]
        room = host.pool.num_free + host.pool.num_cached
        todo = todo[max(len(todo) - room, 0):]
        if not todo:
            return
        host_ids = host.pool.allocate(len(todo))
        copy_blocks(self.gpu, [e.block_id for e in todo], host, host_ids)
        # Reversed, a batch runs head to tail; consecutive links of one chain go in one insert.
        chain: list[tuple[EvictedBlock, BlockId]] = []
        for e, b in reversed(list(zip(todo, host_ids, strict=True))):
            if chain and e.parent != chain[-1][0].hash:
                self._insert_chain(host.cache, chain)
                chain = []
            chain.append((e, b))
        self._insert_chain(host.cache, chain)
        host.cache.release(host_ids)
        self.counters.demoted_blocks += len(todo)

    @staticmethod
    def _insert_chain(cache: PrefixCache, chain: list[tuple[EvictedBlock, BlockId]]) -> None:
        cache.insert([e.hash for e, _ in chain], [b for _, b in chain], chain[0][0].parent)
