"""How many nodes hold each block, followed from the cluster's cache events: the count the metadata
index's holder masks give (popcount), kept here as a plain counter so the simulator's nodes can ask it
on every eviction without a Match."""

from collections import Counter
from collections.abc import Iterable

from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.events import BlockRemoved, BlockStored, CacheEvent


class HolderCount:
    """Nodes holding each block hash (any tier), from BlockStored / BlockRemoved events."""

    def __init__(self) -> None:
        self._count: Counter[BlockHash] = Counter()

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
            else:
                raise TypeError(f"the simulator's nodes never clear their cache: {e!r}")

    def holders(self, block_hash: BlockHash) -> int:
        return self._count.get(block_hash, 0)

    def others(self, block_hash: BlockHash) -> int:
        """Holders besides the asking node, which holds the block itself."""
        return self._count.get(block_hash, 0) - 1
