"""How many nodes hold each block on their gpu, followed from the cluster's cache events: the count of
gpu bits in the metadata index's holder masks, kept here as a plain counter so the simulator's nodes
can ask it on every eviction without a Match. Gpu copies only: they are what a peer can pull (a pull
is served from the gpu tier, as `up`'s transfer source serves it), so a gpu eviction the node's host
tier takes in is still the eviction of the cluster's last gpu copy when no other gpu holds it."""

from collections import Counter
from collections.abc import Iterable

from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.events import AllCleared, BlockStored, CacheEvent, Tier


class HolderCount:
    """Nodes holding each block hash on their gpu, from BlockStored / BlockRemoved events."""

    def __init__(self) -> None:
        self._count: Counter[BlockHash] = Counter()

    def apply(self, events: Iterable[CacheEvent]) -> None:
        count = self._count
        for e in events:
            if isinstance(e, AllCleared):
                raise TypeError(f"the simulator's nodes never clear their cache: {e!r}")
            if e.tier != Tier.GPU:
                continue
            if isinstance(e, BlockStored):
                count.update(e.hashes)
            else:
                count.subtract(e.hashes)
                for h in e.hashes:
                    if count[h] <= 0:
                        del count[h]

    def holders(self, block_hash: BlockHash) -> int:
        return self._count.get(block_hash, 0)

    def others(self, block_hash: BlockHash) -> int:
        """Holders besides the asking node, which holds the block itself."""
        return self._count.get(block_hash, 0) - 1
