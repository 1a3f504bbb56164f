"""S3-FIFO whose probation share adapts to the traffic, as ARC adapts its recency target: the
eviction order that neither bets on one-hit scans (S3-FIFO) nor on long reuse distances (LRU)."""

import heapq
import math

from radixmesh.common.block_pool.s3fifo import S3FIFO
from radixmesh.proto.block_hash import BlockHash


class AdaptiveS3FIFO(S3FIFO):
    """S3FIFO's two queues and ghost, with probation's share a target in blocks that moves.

    Beyond its share, probation's oldest go first, as in S3FIFO. Within it the two queues are
    evicted as one LRU: the least recently released member of either goes (probation's on a tie),
    not main's first, since main holds the heads of the chains whose tails sit in probation, and
    evicting a head strands its tail. So a share of 0 is S3-FIFO with no room for one-hit blocks
    (scan resistant), and a share of the whole pool is plain LRU (a conversation's blocks stay
    together until its next turn, minutes later).

    Both queues' evictions enter the ghost. A block stored under a hash that probation evicted
    means probation was too small to keep it until its re-use: the target grows. One that main
    evicted means main was too small: the target shrinks. Each step is ARC's: one block, or the
    ratio of the other ghost's hashes to this one's when that is larger, so the side whose ghost
    hits are rarer moves the target faster. The target stays within [0, blocks of the pool]. A hash
    the cluster recalls (set_recall) is kept as re-used, as in S3FIFO, but moves no target: it says
    the cluster lost the block, not which of this pool's queues was short.
    """

    ghosts_main = True

    def __init__(self, ref: list[int], hashes: list[BlockHash | None], small_fraction: float = 0.3) -> None:
        # The share it starts from: 0.3 of the pool came closest to the better of LRU and S3-FIFO
        # on the tuning traces (chat, docs, Mooncake arXiv; 8 nodes, 10-100% of their blocks),
        # ahead of 0.1 and 0.5, since a short trace ends before the target settles.
        super().__init__(ref, hashes, small_fraction)
        self.target = small_fraction * len(ref)
        """Blocks probation may hold before its oldest go first (fractional: ARC's ratio steps
        accumulate)."""

    def _small_share(self) -> int:
        return int(self.target)

    def _ghost_hit(self, from_main: bool) -> None:
        # The hit is out of the ghost already: + 1 counts it back into its side, as ARC's ratio does.
        ghosted_small = len(self._ghost) - self.ghosted_main
        if from_main:
            self.target = max(0.0, self.target - max(1.0, ghosted_small / (self.ghosted_main + 1)))
        else:
            self.target = min(self._ghost_cap, self.target + max(1.0, self.ghosted_main / (ghosted_small + 1)))

    def _pop_within_share(self, k: int) -> list[int]:
        """k members (fewer when there are fewer), oldest release first across both queues."""
        small, main = self.small, self.main
        out: list[int] = []
        while len(out) < k:
            small_when, main_when = small.head_when(), main.head_when()
            if small_when <= main_when:
                if small_when == math.inf:
                    break
                # Probation's members up to main's oldest, its equals included (probation wins ties).
                out += self._pop_small(k - len(out), math.nextafter(main_when, math.inf))
            else:
                out += self._pop_main(k - len(out), small_when)
        return out

    def oldest(self, n: int) -> list[int]:
        """Exactly the members pop_oldest(n) would take, in that order; removes none."""
        small = self.small.oldest_released(n)
        # Probation's excess counts its pinned blocks too: pop_oldest takes what members it has.
        first = min(len(small), max(0, self._small_excess()))
        # heapq.merge is stable: at equal release times probation's member comes first.
        rest = heapq.merge(small[first:], self.main.oldest_released(n - first), key=lambda item: item[0])
        return [b for _, b in small[:first]] + [b for _, b in rest][: n - first]

    def check_invariants(self) -> None:
        """S3FIFO's, and a target within its bounds."""
        super().check_invariants()
        assert 0 <= self.target <= self._ghost_cap, f"probation target {self.target} outside [0, {self._ghost_cap}]"
