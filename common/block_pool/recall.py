"""The cluster's ghost: block hashes whose last copy in the cluster was evicted recently.

The metadata index records one per layout from its nodes' BlockRemoved events (a block nobody holds
any more; it recalls only those nobody stored again since); each agent gets the new ones with its
lease and keeps a window of its own. A pool told about them (`PoolHooks.recalled`)
counts a block stored under such a hash as re-used, as it does one its own ghost remembers: the
request that brings a prefix back often lands on another node than the one that evicted it.
"""

from collections.abc import Iterable
from itertools import pairwise

from radixmesh.proto.block_hash import BlockHash

DEFAULT_RECALL_BLOCKS = 65536
"""The ghost hashes each agent remembers (AgentConfig.recall_blocks; the metadata service and the
simulator read it too); recall is on while this is > 0."""


class RecallWindow:
    """The last `capacity` hashes lost, oldest first; each carries the sequence number of its loss."""

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        self.capacity = capacity
        self._lost: dict[BlockHash, int] = {}
        """hash -> sequence number of its (latest) loss; insertion order is loss order."""
        self.seq = 0
        """Sequence number of the latest loss (0: none yet)."""

    def __len__(self) -> int:
        return len(self._lost)

    def __contains__(self, block_hash: BlockHash) -> bool:
        """Whether `block_hash` is among the recent losses."""
        return block_hash in self._lost

    def lose(self, hashes: Iterable[BlockHash]) -> None:
        """The cluster's last copies of `hashes` are gone now; the oldest losses beyond capacity are forgotten."""
        if not self.capacity:
            return
        lost = self._lost
        for h in hashes:
            lost.pop(h, None)  # lost again: the newest loss again
            self.seq += 1
            lost[h] = self.seq
        for _ in range(len(lost) - self.capacity):
            del lost[next(iter(lost))]

    def take(self, block_hash: BlockHash) -> bool:
        """Whether `block_hash` was lost recently; forgets it (an agent recalls a loss once, since it
        does not hear of other nodes storing the block again)."""
        return self._lost.pop(block_hash, None) is not None

    def since(self, cursor: int, limit: int) -> tuple[list[BlockHash], int]:
        """Hashes whose (latest) loss came after sequence number `cursor`, oldest first, at most the
        newest `limit` of them; and the cursor to pass next time."""
        out: list[BlockHash] = []
        for h in reversed(self._lost):
            if self._lost[h] <= cursor or len(out) >= limit:
                break
            out.append(h)
        out.reverse()
        return out, self.seq

    def check_invariants(self) -> None:
        """Bounded, sequence numbers strictly increasing in loss order, none past `seq`."""
        assert len(self._lost) <= self.capacity, f"{len(self._lost)} lost hashes > capacity {self.capacity}"
        seqs = list(self._lost.values())
        assert all(a < b for a, b in pairwise(seqs)), "loss order and sequence numbers disagree"
        assert not seqs or seqs[-1] <= self.seq, f"sequence number {seqs[-1]} past {self.seq}"
