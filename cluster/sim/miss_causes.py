"""Why each computed block was not a hit: the simulator's `SimReport.misses_by_cause`.

``first``: no earlier request had the block (global LRU pays it too); ``held``: another node's gpu
held it when the job started but it was not pulled; ``computing``: another node was computing it
then; ``evicted``: every gpu copy was gone. Copies count on gpus only (`HolderCount`): those are what
a pull can read; a copy left in some node's host or disk tier is ``evicted`` here.
"""

from collections import Counter
from collections.abc import Callable, Sequence

from radixmesh.proto.block_hash import BlockHash

CAUSES = ("first", "held", "computing", "evicted")


class MissCauses:
    """Counts computed blocks by cause; follows which blocks started jobs are computing."""

    def __init__(self, holders: Callable[[BlockHash], int]) -> None:
        self._holders = holders
        self.counts = dict.fromkeys(CAUSES, 0)
        self._seen: set[BlockHash] = set()
        self._computing: Counter[BlockHash] = Counter()
        """Blocks being computed by started jobs, with how many jobs compute each."""

    def started(self, computed: Sequence[BlockHash]) -> None:
        """A job starts computing `computed`: count each by cause."""
        for h in computed:
            if h not in self._seen:
                cause = "first"
            elif self._holders(h):
                cause = "held"
            elif h in self._computing:
                cause = "computing"
            else:
                cause = "evicted"
            self.counts[cause] += 1
            self._computing[h] += 1
        self._seen.update(computed)

    def finished(self, computed: Sequence[BlockHash]) -> None:
        """The job that started computing `computed` is done."""
        self._computing.subtract(computed)
        for h in computed:
            if self._computing[h] <= 0:
                del self._computing[h]
