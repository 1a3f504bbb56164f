"""The evictable (cached) blocks of a pool in least-recently-released order, with lazy deletion."""

from collections import deque
from collections.abc import Sequence

_NOT_MEMBER = -1


class LazyLRU:
    """Cached blocks of a pool ordered by release time; eviction takes the oldest first.

    Lazy deletion: `push` appends one entry ``(tick, time, blocks)`` per release and stamps each
    block with the entry's tick. An entry's block is live only while the block's stamp equals the
    tick and its refcount (the pool's list, shared) is 0, so pinning a cached block costs nothing
    here: its entry just goes stale. Stale copies are skipped when popped and dropped by `_compact`
    once entries hold four times as many blocks as the pool: O(1) amortized per block, no linked nodes.
    """

    def __init__(self, ref: list[int]) -> None:
        self._ref = ref
        self._stamp = [_NOT_MEMBER] * len(ref)
        self._entries: deque[tuple[int, float, tuple[int, ...]]] = deque()
        self._next_tick = 0
        self._entry_blocks = 0  # blocks across entries, stale ones included

    def __contains__(self, block: int) -> bool:
        return self._stamp[block] != _NOT_MEMBER and not self._ref[block]

    def push(self, blocks: Sequence[int], now: float) -> None:
        """Add `blocks` (hashed, ref 0, none of them live) as released at `now`; within the entry,
        earlier blocks are evicted first."""
        tick = self._next_tick
        self._next_tick += 1
        stamp = self._stamp
        for b in blocks:
            stamp[b] = tick
        self._entries.append((tick, now, tuple(blocks)))
        self._entry_blocks += len(blocks)
        if self._entry_blocks > 4 * len(stamp) + 64:
            self._compact()

    def discard(self, blocks: Sequence[int]) -> None:
        """Remove `blocks` for good (evicted); their entries go stale."""
        stamp = self._stamp
        for b in blocks:
            stamp[b] = _NOT_MEMBER

    def pop_oldest(self, k: int) -> list[int]:
        """Remove and return the k least recently released members (the pool knows k <= members)."""
        stamp, ref = self._stamp, self._ref
        out: list[int] = []
        while len(out) < k:
            tick, when, blocks = self._entries.popleft()
            self._entry_blocks -= len(blocks)
            live = [b for b in blocks if stamp[b] == tick and not ref[b]]
            cut = k - len(out)
            for b in live[:cut]:
                stamp[b] = _NOT_MEMBER
            out.extend(live[:cut])
            if len(live) > cut:
                self._entries.appendleft((tick, when, tuple(live[cut:])))
                self._entry_blocks += len(live) - cut
        return out

    def released_before(self, cutoff: float) -> list[int]:
        """Members released strictly before `cutoff`, oldest first (entries are in time order)."""
        stamp, ref = self._stamp, self._ref
        out: list[int] = []
        for tick, when, blocks in self._entries:
            if when >= cutoff:
                break
            out.extend(b for b in blocks if stamp[b] == tick and not ref[b])
        return out

    def members(self) -> list[int]:
        """Every member, oldest first."""
        return self.released_before(float("inf"))

    def _compact(self) -> None:
        stamp, ref = self._stamp, self._ref
        kept: deque[tuple[int, float, tuple[int, ...]]] = deque()
        for tick, when, blocks in self._entries:
            live = [b for b in blocks if stamp[b] == tick and not ref[b]]
            if live:
                kept.append((tick, when, tuple(live)))
        self._entries = kept
        self._entry_blocks = sum(len(blocks) for _, _, blocks in kept)

    def check_invariants(self) -> None:
        """Raise AssertionError unless every stamped ref-0 block is live in exactly one entry."""
        members = self.members()
        assert len(members) == len(set(members)), "a block is live in two LRU entries"
        stamped = sum(1 for b in range(len(self._stamp)) if b in self)
        assert len(members) == stamped, f"LRU: {len(members)} live entries, {stamped} stamped ref-0 blocks"
        assert self._entry_blocks == sum(len(b) for _, _, b in self._entries), "LRU entry count drifted"
