"""One virtual node of the simulator: a real PrefixCache over a real BlockPool, and a FIFO prefill queue.

The node prefills one request at a time in arrival order, so a queued sibling starts after the
request ahead of it has inserted its blocks and finds them cached, as on a real engine.
Cache timeline of one job::

    start: match (pin) the local prefix, take what follows it from the host/disk tiers, allocate
           blocks for the rest (evicting in the pool's order, the evicted going to the tiers)
    prefill: a peer's pull gets the blocks prefilled so far (`done_prefix`)
    done:  insert the new blocks under their hashes, release everything (cached, evictable)
"""

from collections import OrderedDict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from radixmesh.cluster.policy.base import RouteDecision
from radixmesh.cluster.policy.pending_index import PendingHold
from radixmesh.common.block_pool.block_pool import BlockPool
from radixmesh.common.block_pool.config import PoolConfig, PoolHooks
from radixmesh.common.block_pool.eviction import CopiesElsewhere
from radixmesh.common.block_pool.s3fifo import Recalled
from radixmesh.common.prefix_cache.prefix_cache import EvictedBlock, EvictionHook, PrefixCache
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.events import BlockRemoved, BlockStored, CacheEvent, Tier
from radixmesh.proto.ids import BlockId, NodeId


@dataclass(slots=True)
class SimJob:
    """A routed request while its node works on it."""

    index: int
    arrival_s: float
    prompt_tokens: int
    hashes: tuple[BlockHash, ...]
    decision: RouteDecision
    est_tokens: int
    """Tokens the decision expects to prefill (the queue-delay figure other requests see)."""
    hold: PendingHold | None = None
    """The routing decision's pending record, ended when the prefill does."""
    local_ids: list[BlockId] = field(default_factory=list)
    new_ids: list[BlockId] = field(default_factory=list)
    local_blocks: int = 0
    tier_hits: dict[str, int] = field(default_factory=dict)
    """Blocks after the gpu prefix read back from each tier (`SecondChance.SOURCES`)."""
    pull_blocks: int = 0

    @property
    def tier_blocks(self) -> int:
        return sum(self.tier_hits.values())


class SecondChance:
    """A node's host and disk tiers as the simulator models them: LRU victim caches under the gpu.
    A block the gpu evicts goes to the host tier, one the host evicts to disk, one the disk evicts is
    gone; a hit moves the block back up to the gpu (it leaves its tier). With no capacity it holds
    nothing and costs nothing (the gpu-only node `up` runs by default).

    Every move is a cache event on its tier (BlockStored / BlockRemoved with Tier.HOST or Tier.DISK),
    drained by `take_events` in the order the moves happened, so the index learns the tiers as `up`'s
    learns an agent's host tier."""

    SOURCES = ("local_host", "local_disk")
    """Hit sources, in tier order."""
    TIER_OF: ClassVar[Mapping[str, Tier]] = {"local_host": Tier.HOST, "local_disk": Tier.DISK}
    """The tier a source's cache events name."""

    def __init__(self, host_blocks: int, disk_blocks: int) -> None:
        self.levels: list[tuple[str, OrderedDict[BlockHash, BlockHash | None], int]] = [
            (source, OrderedDict(), cap) for source, cap in zip(self.SOURCES, (host_blocks, disk_blocks)) if cap > 0]
        """(source, block -> its parent oldest first, capacity) of each tier with room, top first."""
        self._events: list[CacheEvent] = []

    def __bool__(self) -> bool:
        return bool(self.levels)

    def admit(self, evicted: Sequence[EvictedBlock]) -> None:
        """The gpu evicted these blocks (in its eviction order): they go to the top tier, pushing
        its least recently used down."""
        for e in evicted:
            self._discard(e.hash)
            self._put(0, e.hash, e.parent)

    def take(self, hashes: Sequence[BlockHash]) -> dict[str, int]:
        """Remove the longest prefix of `hashes` the tiers hold (matches are prefixes) and count its
        blocks by source."""
        hits: dict[str, int] = {}
        for h in hashes:
            source = self._discard(h)
            if source is None:
                break
            hits[source] = hits.get(source, 0) + 1
        return hits

    def take_events(self) -> list[CacheEvent]:
        """Drain the tier events since the last call, in order."""
        events, self._events = self._events, []
        return events

    def _put(self, level: int, h: BlockHash, parent: BlockHash | None) -> None:
        while level < len(self.levels):
            source, blocks, cap = self.levels[level]
            blocks[h] = parent
            self._events.append(BlockStored((h,), parent, self.TIER_OF[source]))
            if len(blocks) <= cap:
                return
            # Removed here, then stored below: the order the move happens in.
            h, parent = blocks.popitem(last=False)
            self._events.append(BlockRemoved((h,), self.TIER_OF[source]))
            level += 1

    def _discard(self, h: BlockHash) -> str | None:
        for source, blocks, _ in self.levels:
            if h in blocks:
                del blocks[h]
                self._events.append(BlockRemoved((h,), self.TIER_OF[source]))
                return source
        return None

    def hashes(self) -> list[BlockHash]:
        """Every block the tiers hold, top tier first."""
        return [h for _, blocks, _ in self.levels for h in blocks]

    def check_invariants(self) -> None:
        seen = 0
        for source, blocks, cap in self.levels:
            assert len(blocks) <= cap, f"{source} holds {len(blocks)} > {cap} blocks"
            seen += len(blocks)
        assert len({h for _, blocks, _ in self.levels for h in blocks}) == seen, "a block in two tiers"


class SimNode:
    """Queue and cache of one node; the simulator moves jobs through start() and finish()."""

    def __init__(self, node: NodeId, capacity_blocks: int, prefill_tokens_per_s: float,
                 copies: CopiesElsewhere | None = None, eviction_window: int = 0,
                 eviction: str = "lru", on_evict: EvictionHook | None = None,
                 recalled: Recalled | None = None, tiers: SecondChance | None = None) -> None:
        self.node = node
        self.tiers = tiers or SecondChance(0, 0)
        self.cache: PrefixCache
        chain_ends = None
        if copies is not None:
            # Cluster-aware eviction prefers blocks another node holds, but only chain ends here:
            # evicting a chain's head would strand its cached tail (matches are prefixes).
            chain_ends = lambda h: copies(h) if self.cache.is_leaf(h) else 0
        hooks = PoolHooks(copies_elsewhere=chain_ends, eviction_window=eviction_window if copies is not None else 0,
                          recalled=recalled)
        pool = BlockPool(capacity_blocks, config=PoolConfig(eviction=eviction), hooks=hooks)
        self.cache = PrefixCache(pool, on_evict=self._demote(on_evict) if self.tiers else on_evict)
        self.rate = prefill_tokens_per_s
        self.waiting: deque[SimJob] = deque()
        self.current: SimJob | None = None
        self.busy_until = 0.0
        self.compute_from = 0.0
        """When the current job's prefill began (after its pull)."""
        self.waiting_tokens = 0
        self.routed = 0
        self.routed_tokens = 0
        self.computed_tokens = 0
        """Prompt tokens this node prefilled (what it did not reuse): its share of the work, which
        the load cap bounds (recent work counts computed tokens, InflightTable.record_routed)."""

    def _demote(self, on_evict: EvictionHook | None) -> EvictionHook:
        def evicted(blocks: Sequence[EvictedBlock]) -> None:
            self.tiers.admit(blocks)
            if on_evict is not None:
                on_evict(blocks)
        return evicted

    @property
    def inflight(self) -> int:
        return len(self.waiting) + (self.current is not None)

    def queued_tokens(self, now: float) -> int:
        """Estimated prefill tokens ahead of a new arrival: the waiting jobs plus the current one's rest."""
        rest = max(0.0, self.busy_until - now) * self.rate if self.current is not None else 0.0
        return self.waiting_tokens + int(rest)

    def enqueue(self, job: SimJob) -> None:
        self.waiting.append(job)
        self.waiting_tokens += job.est_tokens
        self.routed += 1
        self.routed_tokens += job.prompt_tokens

    def start_next(self, peer_prefix: int) -> SimJob:
        """Begin the next waiting job; `peer_prefix` is how many of its blocks the planned peer holds
        now (0 when it plans no pull). Sets the job's realized local and pulled blocks."""
        assert self.current is None and self.waiting, "start_next on a busy or empty node"
        job = self.waiting.popleft()
        self.waiting_tokens -= job.est_tokens
        self.current = job
        job.local_ids = self.cache.match(job.hashes)
        job.local_blocks = len(job.local_ids)
        pool = self.cache.pool
        # A prompt longer than what the pool can spare caches only its first blocks; a tier hit
        # past them could not be loaded into the gpu, so the tiers are asked only for those.
        room = pool.num_free + pool.num_cached
        # Taken before allocating: the allocation's evictions go to the tiers and must not push
        # out the blocks this job reads back.
        job.tier_hits = self.tiers.take(job.hashes[job.local_blocks : job.local_blocks + room])
        planned_end = job.decision.local_blocks + job.decision.pull_blocks
        # The peer may have evicted since routing (pull less: recompute the rest), and our own
        # prefix may have grown (pull only what we still lack).
        job.pull_blocks = max(0, min(peer_prefix, planned_end) - job.local_blocks - job.tier_blocks)
        job.new_ids = pool.allocate(min(len(job.hashes) - job.local_blocks, room))
        return job

    def done_prefix(self, now: float, block_tokens: int) -> tuple[BlockHash, ...]:
        """The current job's leading blocks a peer could pull at `now`: its local prefix, what it
        read from its tiers and pulled, and the blocks prefilled so far (the engine commits each chunk's full blocks to its
        prefix cache as the chunk ends, so a pull during a prefill gets the finished part)."""
        job = self.current
        if job is None:
            return ()
        ready = job.local_blocks
        if now >= self.compute_from:
            done = int((now - self.compute_from) * self.rate) // block_tokens
            loaded = job.local_blocks + job.tier_blocks + job.pull_blocks
            ready = min(loaded + done, job.local_blocks + len(job.new_ids))
        return job.hashes[:ready]

    def finish(self) -> SimJob:
        """End the current job: its new blocks become cached. Returns it."""
        job = self.current
        assert job is not None, "finish on an idle node"
        lo = job.local_blocks
        if job.new_ids:
            hashes = job.hashes[lo : lo + len(job.new_ids)]
            self.cache.insert(hashes, job.new_ids, job.hashes[lo - 1] if lo else None)
        self.cache.release(job.local_ids + job.new_ids)
        self.current = None
        return job

    def take_events(self) -> list[CacheEvent]:
        """The tiers' events, then the gpu's. Tiers first: a block the gpu evicts is on the host
        before it leaves the gpu, so the index never sees the node drop it (no last-copy loss in
        the cluster's ghost); a block's own tier events stay in order, and tiers have separate bits."""
        return self.tiers.take_events() + self.cache.take_events()

    def held_blocks(self) -> int:
        """Blocks this node holds on some tier (a block on gpu and in a tier counts once)."""
        return len(self.cache) + sum(h not in self.cache for h in self.tiers.hashes())

    def check_invariants(self) -> None:
        self.cache.check_invariants()
        self.tiers.check_invariants()
        pinned = 0 if self.current is None else len(self.current.local_ids) + len(self.current.new_ids)
        assert self.cache.pool.num_in_use == pinned, (
            f"{self.cache.pool.num_in_use} in use, job holds {pinned}"
        )
        assert self.waiting_tokens == sum(j.est_tokens for j in self.waiting), "waiting_tokens drifted"
