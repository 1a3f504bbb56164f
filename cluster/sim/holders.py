"""How many nodes hold each block, followed from the cluster's cache events: the count the metadata
index's holder masks give (popcount), kept here as a plain counter so the simulator's nodes can ask it
on every eviction without a Match; and which blocks lost their last copy recently (a ghost)."""

from collections import Counter
from collections.abc import Iterable

from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.events import BlockRemoved, BlockStored, CacheEvent


class HolderCount:
    """Nodes holding each block hash (any tier), from BlockStored / BlockRemoved events."""

    def __init__(self, ghost_capacity: int = 0) -> None:
        self._count: Counter[BlockHash] = Counter()
        self._ghost: dict[BlockHash, None] = {}
        """Hashes whose last copy in the cluster was evicted, oldest first, at most ghost_capacity."""
        self._ghost_cap = ghost_capacity

    def apply(self, events: Iterable[CacheEvent]) -> None:
        count = self._count
        for e in events:
            if isinstance(e, BlockStored):
                count.update(e.hashes)
            elif isinstance(e, BlockRemoved):
                count.subtract(e.hashes)
                for h in e.hashes:
                    if count[h] <= 0:
                        del count[h]
                        self._remember(h)
            else:
                raise TypeError(f"the simulator's nodes never clear their cache: {e!r}")

    def _remember(self, h: BlockHash) -> None:
        ghost = self._ghost
        if not self._ghost_cap:
            return
        ghost.pop(h, None)  # re-inserted: the newest again
        ghost[h] = None
        if len(ghost) > self._ghost_cap:
            del ghost[next(iter(ghost))]

    def evicted_recently(self, block_hash: BlockHash) -> bool:
        """Whether the cluster's last copy of `block_hash` was among its last `ghost_capacity` such
        evictions (and no node stored it since)."""
        return block_hash in self._ghost and block_hash not in self._count

    def holders(self, block_hash: BlockHash) -> int:
        return self._count.get(block_hash, 0)

    def others(self, block_hash: BlockHash) -> int:
        """Holders besides the asking node, which holds the block itself."""
        return self._count.get(block_hash, 0) - 1
