"""Block hash -> block id for one tier: longest-prefix match, insert after prefill, and the events
that let the global index follow every change."""

from collections import Counter
from collections.abc import Callable, Sequence
from typing import NamedTuple

from radixmesh.common.block_pool.block_pool import BlockPool
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.events import BlockRemoved, BlockStored, CacheEvent
from radixmesh.proto.ids import BlockId


class EvictedBlock(NamedTuple):
    """A cached block the pool is evicting, as its cache knew it."""

    block_id: BlockId
    hash: BlockHash
    parent: BlockHash | None
    """The hash before `hash` in its chain (None at a chain's start)."""


EvictionHook = Callable[[Sequence[EvictedBlock]], None]


class PrefixCache:
    """The matchable blocks of one BlockPool, keyed by chained block hash.

    A hash is in the table exactly while its block is hashed in the pool (in use or cached); the
    pool's evictions come back through its eviction listener and are emitted as BlockRemoved.
    Because hashes are chained, a table hit at position i implies the whole prefix up to i matches.

    `on_evict`, when given, sees every batch of evicted blocks after they left the table and before
    the pool hands their slots to anyone: their KV is still intact, so it can copy them elsewhere
    (demotion to a lower tier). It must not touch this cache's pool, and must not raise: it runs
    inside the pool's allocate / evict / gc, which cannot be undone at that point.
    """

    def __init__(self, pool: BlockPool, *, on_evict: EvictionHook | None = None) -> None:
        self.pool = pool
        self.tier = pool.tier
        self._table: dict[BlockHash, BlockId] = {}
        self._parent: dict[BlockHash, BlockHash | None] = {}
        self._children: Counter[BlockHash] = Counter()
        """Cached hashes whose parent is the key: a block with none ends every chain through it here."""
        self._events: list[CacheEvent] = []
        self.query_blocks = 0
        self.hit_blocks = 0
        self._on_evict_hook = on_evict
        pool.attach_cache(self._on_evict)

    def __len__(self) -> int:
        return len(self._table)

    def __contains__(self, block_hash: BlockHash) -> bool:
        """Whether `block_hash` is cached here (pins nothing, counts no query)."""
        return block_hash in self._table

    def match(self, hashes: Sequence[BlockHash]) -> list[BlockId]:
        """Blocks of the longest cached prefix of `hashes`, each pinned (+1 ref); the caller must
        release() them. A pinned block leaves the LRU; its recency renews when it is released."""
        # map() and list.index run the per-block lookup loop in C; a miss ends the prefix.
        found = list(map(self._table.get, hashes))
        if None in found:
            found = found[: found.index(None)]
        self.query_blocks += len(hashes)
        self.hit_blocks += len(found)
        blocks: list[BlockId] = found  # type: ignore[assignment]  # the None tail is cut off
        self.pool.pin(blocks)
        return blocks

    def longest_prefix(self, hashes: Sequence[BlockHash]) -> int:
        """Length of the cached prefix of `hashes`; pins nothing and counts no query."""
        found = list(map(self._table.get, hashes))
        return found.index(None) if None in found else len(found)

    def insert(
        self, hashes: Sequence[BlockHash], block_ids: Sequence[BlockId], parent: BlockHash | None = None
    ) -> None:
        """Make `block_ids` (held by the caller, KV written) matchable under `hashes`.

        `parent` is the hash before hashes[0] (None at the start of a sequence). A hash already
        cached keeps its existing block: the caller's duplicate stays private and is freed when
        released. Emits one BlockStored per run of newly stored hashes. Raises ValueError (and
        changes nothing) on mismatched lengths, repeated hashes or blocks, a block not in use, or a
        block already named by another hash.
        """
        if len(hashes) != len(block_ids):
            raise ValueError(f"{len(hashes)} hashes for {len(block_ids)} blocks")
        if len(set(hashes)) != len(hashes) or len(set(block_ids)) != len(block_ids):
            raise ValueError("insert needs distinct hashes and distinct blocks")
        pool, table = self.pool, self._table
        for h, b in zip(hashes, block_ids, strict=True):
            if pool.ref_count(b) == 0:
                raise ValueError(f"block {b} is not held by the caller (ref 0)")
            if table.get(h) != b and pool.hash_of(b) is not None:
                raise ValueError(f"block {b} is already cached under another hash")
        prev = parent
        run: list[BlockHash] = []
        run_parent = parent
        for h, b in zip(hashes, block_ids, strict=True):
            if h in table:
                self._emit_stored(run, run_parent)
                run, run_parent = [], h
            else:
                pool.set_hash(b, h)
                table[h] = b
                self._parent[h] = prev
                if prev is not None:
                    self._children[prev] += 1
                run.append(h)
            prev = h
        self._emit_stored(run, run_parent)

    def release(self, block_ids: Sequence[BlockId]) -> None:
        """Drop one reference each; a hashed block at ref 0 stays cached, an unhashed one is freed."""
        self.pool.free(block_ids)

    def demote(self, block_ids: Sequence[BlockId]) -> int:
        """A peer pulled these blocks: the cached ones go first when space is needed
        (BlockPool.demote); they stay matchable until then. Returns how many were demoted."""
        return self.pool.demote(block_ids)

    def take_events(self) -> list[CacheEvent]:
        """Drain the BlockStored / BlockRemoved events emitted since the last call, in order."""
        events, self._events = self._events, []
        return events

    def has_events(self) -> bool:
        """Whether take_events has any to drain. The one read that is safe from any thread without the
        pool's owner (a list's length, read atomically): an answer gone stale as it returns only
        leaves the new events for the next drain."""
        return bool(self._events)

    def snapshot(self) -> list[tuple[BlockHash, BlockHash | None]]:
        """Every cached (hash, parent) in insertion order: a full resync for the index. A parent may
        have been evicted while its child stays cached; the index keeps such a child unreachable."""
        return list(self._parent.items())

    def blocks(self) -> list[EvictedBlock]:
        """Every cached block with its hash and parent, in insertion order: what a clean stop writes
        to the disk tier (memory.tiers.persist_resident)."""
        return [EvictedBlock(self._table[h], h, p) for h, p in self._parent.items()]

    def _emit_stored(self, run: list[BlockHash], parent: BlockHash | None) -> None:
        if run:
            self._events.append(BlockStored(tuple(run), parent, self.tier))

    def is_leaf(self, block_hash: BlockHash) -> bool:
        """Whether no cached block here names `block_hash` as its parent (evicting it cuts no chain)."""
        return not self._children.get(block_hash)

    def _on_evict(self, pairs: Sequence[tuple[BlockId, BlockHash]]) -> None:
        evicted = [EvictedBlock(b, h, self._parent.pop(h)) for b, h in pairs]
        children = self._children
        for e in evicted:
            if e.parent is not None:
                children[e.parent] -= 1
                if not children[e.parent]:
                    del children[e.parent]
        for _, h in pairs:
            del self._table[h]
        self._events.append(BlockRemoved(tuple(h for _, h in pairs), self.tier))
        if self._on_evict_hook is not None:
            self._on_evict_hook(evicted)

    def check_invariants(self) -> None:
        """Pool invariants, plus: the table names exactly the pool's hashed blocks, one to one."""
        self.pool.check_invariants()
        for h, b in self._table.items():
            assert self.pool.hash_of(b) == h, f"table maps a hash to block {b}, whose hash differs"
        hashed = sum(1 for b in range(self.pool.num_blocks) if self.pool.hash_of(BlockId(b)) is not None)
        assert hashed == len(self._table), (
            f"{hashed} hashed blocks in the pool, {len(self._table)} in the table"
        )
        assert self._parent.keys() == self._table.keys(), "parent map and table disagree"
        kids = Counter(p for p in self._parent.values() if p is not None)
        assert kids == self._children, "child counts drifted from the parent map"
