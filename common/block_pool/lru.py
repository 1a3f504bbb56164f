"""The evictable (cached) blocks of a pool in least-recently-released order, with lazy deletion."""

from collections import deque
from collections.abc import Sequence
from operator import itemgetter
from typing import Any


def read_many(values: list[Any], ids: Sequence[int]) -> tuple[Any, ...]:
    """``values[i]`` for each of `ids`, as a tuple: how the pool's hot paths (and this LRU's) read
    many entries of a flat per-block list at once.

    Two ids or more are read in one C call (itemgetter), several times cheaper per id than a Python
    loop or ``map(values.__getitem__, ids)``; the caller then counts or tests the tuple in C too.
    Negative ids index from the end, as with a list; an id past the end raises IndexError.
    """
    if len(ids) > 1:
        return itemgetter(*ids)(values)  # type: ignore[no-any-return]
    return tuple(values[i] for i in ids)


class Group:
    """Blocks released together: one position in the LRU, its blocks evicted in tuple order.

    `gen` counts the group's moves to the tail; a queue item ``(gen, group)`` is current only while
    its gen is the group's, so a move leaves the older item stale in O(1).
    """

    __slots__ = ("blocks", "gen", "when")

    def __init__(self, blocks: tuple[int, ...], when: float) -> None:
        self.blocks = blocks
        self.gen = 0
        self.when = when


class LazyLRU:
    """Cached blocks of a pool ordered by release time; eviction takes the oldest first.

    Lazy deletion: `push` appends one group per release and stamps each of its blocks with it. A
    block is a member while it is stamped and its refcount (the pool's list, shared) is 0, so pinning
    a cached block costs nothing here. `renew` moves a whole group to the tail in O(1) when exactly
    its blocks are released again (a prefix pinned and unpinned as a unit: transfers, promotions,
    probes), with no per-block stamp. Queue items go stale (a renewed group's older item, a group
    whose blocks were all pinned, re-released elsewhere or evicted); they are skipped when popped
    and dropped by `_compact` once the queue is twice as long as the pool has blocks: O(1)
    amortized per block, no linked nodes.
    """

    def __init__(self, ref: list[int]) -> None:
        self._ref = ref
        self._stamp: list[Group | None] = [None] * len(ref)
        self._queue: deque[tuple[int, Group]] = deque()
        self.stamped = 0
        """Blocks stamped here: the members plus those pinned since they were pushed."""

    def __contains__(self, block: int) -> bool:
        return self._stamp[block] is not None and not self._ref[block]

    def is_stamped(self, block: int) -> bool:
        """Whether `block` was pushed here and not removed since (a member, or pinned after its push)."""
        return self._stamp[block] is not None

    def push(self, blocks: Sequence[int], now: float) -> None:
        """Add `blocks` (hashed, ref 0, none of them members) as released at `now`, as one group;
        earlier blocks are evicted first."""
        self._append(self._stamp_group(blocks, now))

    def push_first(self, blocks: Sequence[int]) -> None:
        """Add `blocks` (hashed, ref 0, none a member) ahead of every member: evicted first, and
        idle since ever for GC. The last blocks pushed first go first."""
        group = self._stamp_group(blocks, float("-inf"))
        self._queue.appendleft((group.gen, group))

    def demote(self, blocks: Sequence[int]) -> None:
        """Members `blocks` move ahead of every other member (EvictionOrder.demote)."""
        self.discard(blocks)
        self.push_first(blocks)

    def _stamp_group(self, blocks: Sequence[int], when: float) -> Group:
        group = Group(tuple(blocks), when)
        stamp = self._stamp
        fresh = 0
        for b in blocks:
            fresh += stamp[b] is None
            stamp[b] = group
        self.stamped += fresh
        return group

    def set_recall(self, recalled: object) -> None:
        """LRU keeps no history of evicted blocks, so it has no use for the cluster's (EvictionOrder)."""

    def group_of(self, blocks: tuple[int, ...]) -> Group | None:
        """The group made of exactly `blocks`, in this order, all still stamped with it; else None.

        Such blocks are distinct, in range, hashed and none was evicted since the group was pushed,
        which is what lets the pool skip checking them one by one.
        """
        try:
            group = self._stamp[blocks[0]]
        except IndexError:
            return None
        if group is None or group.blocks != blocks or read_many(self._stamp, blocks).count(group) != len(blocks):
            return None
        return group

    def renew(self, group: Group, now: float) -> None:
        """Move `group` (from `group_of`; its blocks just came back to ref 0) to the tail, as
        released at `now`."""
        group.gen += 1
        group.when = now
        self._append(group)

    def discard(self, blocks: Sequence[int]) -> None:
        """Remove `blocks` for good (evicted); their groups keep only their other blocks."""
        stamp = self._stamp
        gone = 0
        for b in blocks:
            gone += stamp[b] is not None
            stamp[b] = None
        self.stamped -= gone

    def pop_oldest(self, k: int, before: float = float("inf")) -> list[int]:
        """Remove and return the k least recently released members (fewer when there are fewer),
        only those released strictly before `before`."""
        stamp = self._stamp
        out: list[int] = []
        while len(out) < k and self._queue:
            gen, group = self._queue.popleft()
            if gen != group.gen:
                continue
            if group.when >= before:
                self._queue.appendleft((gen, group))
                break
            live = self._live(group)
            cut = k - len(out)
            for b in live[:cut]:
                stamp[b] = None
            out.extend(live[:cut])
            if len(live) > cut:
                group.blocks = tuple(live[cut:])
                self._queue.appendleft((gen, group))
        self.stamped -= len(out)
        return out

    def head_when(self) -> float:
        """When the least recently released member was released (inf when there is none). Drops the
        items ahead of it, which pop_oldest would skip: O(1) amortized."""
        queue = self._queue
        while queue:
            gen, group = queue[0]
            if gen == group.gen and self._live(group):
                return group.when
            queue.popleft()
        return float("inf")

    def oldest(self, n: int) -> list[int]:
        """The n least recently released members (fewer if there are fewer), oldest first; removes none."""
        return [b for _, b in self.oldest_released(n)]

    def oldest_released(self, n: int) -> list[tuple[float, int]]:
        """`oldest(n)`, each member with its release time."""
        out: list[tuple[float, int]] = []
        for gen, group in self._queue:
            if len(out) >= n:
                break
            if gen == group.gen:
                out.extend((group.when, b) for b in self._live(group))
        return out[:n]

    def released_before(self, cutoff: float) -> list[int]:
        """Members released strictly before `cutoff`, oldest first (current items are in time order)."""
        out: list[int] = []
        for gen, group in self._queue:
            if gen != group.gen:
                continue
            if group.when >= cutoff:
                break
            out.extend(self._live(group))
        return out

    def members(self) -> list[int]:
        """Every member, oldest first."""
        return self.released_before(float("inf"))

    def _live(self, group: Group) -> list[int]:
        stamp, ref = self._stamp, self._ref
        return [b for b in group.blocks if stamp[b] is group and not ref[b]]

    def _append(self, group: Group) -> None:
        self._queue.append((group.gen, group))
        if len(self._queue) > 2 * len(self._stamp) + 64:
            self._compact()

    def _compact(self) -> None:
        # Current items with a member stay; at most one per block, so the queue at least halves.
        self._queue = deque(item for item in self._queue if item[0] == item[1].gen and self._live(item[1]))

    def check_invariants(self) -> None:
        """Raise AssertionError unless every stamped ref-0 block is a member of exactly one current item."""
        members = self.members()
        assert len(members) == len(set(members)), "a block is live in two LRU items"
        stamped = sum(1 for b in range(len(self._stamp)) if b in self)
        assert len(members) == stamped, f"LRU: {len(members)} live members, {stamped} stamped ref-0 blocks"
        stamps = sum(1 for s in self._stamp if s is not None)
        assert stamps == self.stamped, f"LRU: {stamps} stamped blocks, counter {self.stamped}"
        current = [id(group) for gen, group in self._queue if gen == group.gen]
        assert len(current) == len(set(current)), "a group is current at two queue positions"
