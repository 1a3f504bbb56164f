"""Free blocks of a pool kept as maximal runs of consecutive ids, indexed by size for best fit; and
where a contiguous allocation that no free run fits is carved: the window that evicts the fewest."""

import bisect
from collections.abc import Iterable
from typing import Protocol


class FreeRuns:
    """The free block ids of one pool as maximal runs ``[start, start + length)``.

    Contract: runs never overlap and never touch (adding a block coalesces it with free neighbours),
    so the largest run is the longest contiguous allocation the free blocks alone can serve.
    Adding or taking a run costs O(1) dict work plus an O(k) insert into the sorted list of the
    k distinct run sizes; k <= sqrt(2 * num_free), because distinct sizes must sum to <= num_free.
    """

    def __init__(self, num_blocks: int) -> None:
        self._len_at: dict[int, int] = {}  # run start -> length
        self._start_at_last: dict[int, int] = {}  # run's last block -> start, for coalescing leftwards
        # size -> starts; a dict keeps insertion order, so best fit takes the oldest run of that size
        self._starts_by_size: dict[int, dict[int, None]] = {}
        self._sizes: list[int] = []  # distinct run sizes, ascending
        self.num_free = 0
        if num_blocks > 0:
            self._insert(0, num_blocks)

    def _insert(self, start: int, length: int) -> None:
        self._len_at[start] = length
        self._start_at_last[start + length - 1] = start
        starts = self._starts_by_size.get(length)
        if starts is None:
            starts = self._starts_by_size[length] = {}
            bisect.insort(self._sizes, length)
        starts[start] = None
        self.num_free += length

    def _remove(self, start: int) -> int:
        length = self._len_at.pop(start)
        del self._start_at_last[start + length - 1]
        starts = self._starts_by_size[length]
        del starts[start]
        if not starts:
            del self._starts_by_size[length]
            self._sizes.pop(bisect.bisect_left(self._sizes, length))
        self.num_free -= length
        return length

    def add_run(self, start: int, length: int) -> None:
        """Mark ``[start, start + length)`` free (none of it may be free already); coalesces."""
        left = self._start_at_last.get(start - 1)
        if left is not None:
            length += self._remove(left)
            start = left
        if start + length in self._len_at:
            length += self._remove(start + length)
        self._insert(start, length)

    def add(self, blocks: Iterable[int]) -> None:
        """Mark `blocks` free, grouping consecutive ids so a freed run costs O(1) index work."""
        ordered = sorted(blocks)
        i = 0
        while i < len(ordered):
            j = i + 1
            while j < len(ordered) and ordered[j] == ordered[j - 1] + 1:
                j += 1
            self.add_run(ordered[i], j - i)
            i = j

    def largest(self) -> int:
        """Length of the longest free run (0 when nothing is free)."""
        return self._sizes[-1] if self._sizes else 0

    def take_run(self, n: int) -> list[int] | None:
        """The head of the best-fitting run (the shortest run of length >= n), or None if none fits."""
        i = bisect.bisect_left(self._sizes, n)
        if i == len(self._sizes):
            return None
        start = next(iter(self._starts_by_size[self._sizes[i]]))
        length = self._remove(start)
        if length > n:
            self._insert(start + n, length - n)  # the tail's neighbours are in use: no coalescing
        return list(range(start, start + n))

    def take(self, n: int) -> list[int]:
        """n free blocks (n <= num_free): one best-fitting run when one fits, else the longest runs
        first, so the allocation is split into as few runs as the free space allows."""
        assert 0 < n <= self.num_free, (n, self.num_free)
        run = self.take_run(n)
        if run is not None:
            return run
        out: list[int] = []
        while len(out) < n:
            # No run fits all that is left, so the longest one is taken whole, except that the last
            # piece takes only the head it needs.
            start = next(iter(self._starts_by_size[self._sizes[-1]]))
            length = self._remove(start)
            used = min(length, n - len(out))
            if used < length:
                self._insert(start + used, length - used)
            out.extend(range(start, start + used))
        return out

    def take_range(self, start: int, n: int) -> list[int]:
        """Take exactly ``[start, start + n)``, which must lie inside one free run.

        Finding the run walks left from `start`: this serves the rare path of carving a window
        after evicting cached blocks, not the hot path.
        """
        head = start
        while head not in self._len_at:
            head -= 1
            assert head >= 0, f"block {start} is not free"
        length = self._remove(head)
        assert start + n <= head + length, (start, n, head, length)
        if start > head:
            self._insert(head, start - head)
        if head + length > start + n:
            self._insert(start + n, head + length - start - n)
        return list(range(start, start + n))

    def growth_order(self, candidates: Iterable[int]) -> list[int]:
        """The candidates (none free) that join a free run when freed one at a time in the returned
        order: each borders a run, or a candidate freed before it. The others are left out."""
        left = set(candidates)
        work = [b for b in left if self.borders(b)]
        out: list[int] = []
        while work:
            b = work.pop()
            if b not in left:
                continue
            left.discard(b)
            out.append(b)
            work.extend(nb for nb in (b - 1, b + 1) if nb in left)
        return out

    def borders(self, block: int) -> bool:
        """Whether `block` (not free) sits right next to a free run."""
        return block - 1 in self._start_at_last or block + 1 in self._len_at

    def runs(self) -> list[tuple[int, int]]:
        """Every free run as (start, length), by start."""
        return sorted(self._len_at.items())

    def sizes(self) -> list[int]:
        """Length of every free run (one entry per run), ascending."""
        return sorted(self._len_at.values())

    def check_invariants(self, num_blocks: int) -> None:
        """Raise AssertionError unless the runs are disjoint, non-touching, in range and indexed."""
        prev_end = -2
        total = 0
        for start, length in self.runs():
            assert length > 0 and start >= 0 and start + length <= num_blocks, (start, length, num_blocks)
            assert start > prev_end, (
                f"free runs overlap or touch at {start} (previous run ends at {prev_end})"
            )
            assert self._start_at_last.get(start + length - 1) == start, (start, length)
            assert start in self._starts_by_size.get(length, {}), (start, length)
            prev_end = start + length
            total += length
        assert total == self.num_free, f"free runs hold {total} blocks, num_free says {self.num_free}"
        assert len(self._start_at_last) == len(self._len_at), (len(self._start_at_last), len(self._len_at))
        indexed = sum(len(s) for s in self._starts_by_size.values())
        assert indexed == len(self._len_at), f"size index holds {indexed} runs, there are {len(self._len_at)}"
        assert self._sizes == sorted(self._starts_by_size), (self._sizes, sorted(self._starts_by_size))


class Members(Protocol):
    """Which blocks are cached (an EvictionOrder)."""

    def __contains__(self, block: int) -> bool: ...


def cheapest_window(ref: list[int], cached: Members, n: int) -> int | None:
    """Start of the run of n consecutive blocks, none in use (ref > 0), holding the fewest `cached`
    blocks (the lowest such start); None when no such run exists. One pass, O(len(ref)): it only
    runs when no free run fits, so the scan is paid rarely."""
    best_start, best_cost = None, n + 1
    streak = cost = 0
    for b in range(len(ref)):
        if ref[b]:
            streak = cost = 0
            continue
        streak += 1
        cost += b in cached
        if streak > n:
            cost -= (b - n) in cached
        if streak >= n and cost < best_cost:
            best_start, best_cost = b - n + 1, cost
    return best_start
