"""Scan-resistant eviction order for cached blocks (S3-FIFO / 2Q style): a probationary queue for blocks
used once, a main queue for blocks used again, and a ghost of recent evictions."""

import sys
from collections import OrderedDict
from collections.abc import Callable, Sequence

from radixmesh.common.block_pool.lru import Group, LazyLRU
from radixmesh.proto.block_hash import BlockHash

_DEMOTED = -sys.float_info.max
"""Release times below it are demoted members' (LazyLRU.push_first stamps them -inf): once probation
is within its share they still go before main's, as EvictionOrder.demote promises; taken after
main's, a block the pool demoted (a peer had just pulled it) outlived reused ones."""

Recalled = Callable[[BlockHash], bool]
"""Whether the cluster evicted its last copy of a block recently (the index's ghost of evictions)."""


class S3FIFO:
    """Cached blocks of a pool in two LazyLRU queues; the pool sees one eviction order.

    A block released for the first time since it was stored (the suffix a request computed) enters
    `small`, the probationary queue. A block released again after a re-use (a match, a transfer pin)
    moves to `main`, as does a block stored under a hash that probation evicted not long ago (the
    ghost: it came back, so it is worth keeping). Eviction takes probation's oldest while probation
    holds more than `small_fraction` of the blocks here, else main's oldest (each queue in
    least-recently-released order). So one-hit suffixes, most of a prefix-cache trace's blocks,
    leave before a shared prefix that a few of them pushed to the back of one LRU.

    Queue shares are counted on stamped blocks (members, and members pinned since: the pool pins
    without telling the order), which keeps the count O(1) and differs only by the running batch.

    Subclasses vary three things, nothing else: how many blocks probation may hold
    (`_small_share`), which queue gives once probation is within it (`_pop_within_share`), and what
    a hash coming back from the ghost teaches them (`_ghost_hit`); with `ghosts_main` set, main's
    evictions enter the ghost too (marked as such), and a hash coming back from there goes to main
    as well.
    """

    ghosts_main = False
    """Whether main's evictions are remembered (S3-FIFO remembers probation's only)."""

    def __init__(self, ref: list[int], hashes: list[BlockHash | None], small_fraction: float = 0.1) -> None:
        if not 0.0 < small_fraction < 1.0:
            raise ValueError(f"small_fraction must lie in (0, 1), got {small_fraction}")
        self._hashes = hashes
        self.small = LazyLRU(ref)
        self.main = LazyLRU(ref)
        self.small_fraction = small_fraction
        self._ghost: OrderedDict[BlockHash, bool] = OrderedDict()
        """Hashes evicted recently, oldest first, at most as many as the pool has blocks; True for those
        evicted from main. An OrderedDict, not a dict: a dict finds its oldest key by skipping the
        slots of every key deleted before it, which made dropping the oldest O(n) here."""
        self._ghost_cap = len(ref)
        self.ghosted_main = 0
        """Hashes in the ghost evicted from main (the rest came from probation)."""
        self._recalled: Recalled | None = None

    def __contains__(self, block: int) -> bool:
        return block in self.small or block in self.main

    def push(self, blocks: Sequence[int], now: float) -> None:
        """Add `blocks` (hashed, ref 0, none a member) as released at `now`: re-used or ghosted ones
        to main, the others to probation, each part in the given order."""
        small, main, ghost, hashes, recalled = self.small, self.main, self._ghost, self._hashes, self._recalled
        reused: list[int] = []
        fresh: list[int] = []
        for b in blocks:
            if main.is_stamped(b):
                reused.append(b)
            elif small.is_stamped(b):
                reused.append(b)
                small.discard([b])
            elif ghost and hashes[b] in ghost:
                from_main = ghost.pop(hashes[b])  # type: ignore[arg-type]  # pushed blocks are hashed
                self.ghosted_main -= from_main
                self._ghost_hit(from_main)
                reused.append(b)
            elif recalled is not None and recalled(hashes[b]):  # type: ignore[arg-type]
                reused.append(b)
            else:
                fresh.append(b)
        if fresh:
            small.push(fresh, now)
        if reused:
            main.push(reused, now)

    def set_recall(self, recalled: Recalled | None) -> None:
        """The cluster's ghost: a block stored under a hash it recalls counts as re-used, as one in our
        own ghost does, since the request that brings a prefix back may land on another node than the
        one that evicted it."""
        self._recalled = recalled

    def demote(self, blocks: Sequence[int]) -> None:
        """Members `blocks` go to the head of probation (out of main, if there): the next to go.
        Evicted from there they enter the ghost as any probation block does, so one that comes
        back here counts as re-used."""
        self.small.discard(blocks)
        self.main.discard(blocks)
        self.small.push_first(blocks)

    def group_of(self, blocks: tuple[int, ...]) -> Group | None:
        """A main group of exactly `blocks` (LazyLRU.group_of); a probation group is never renewed whole,
        since its release is a re-use that promotes it (the pool then takes its push path)."""
        return self.main.group_of(blocks)

    def renew(self, group: Group, now: float) -> None:
        self.main.renew(group, now)

    def discard(self, blocks: Sequence[int]) -> None:
        """Remove `blocks` for good (evicted); those leaving probation (and main, with `ghosts_main`)
        are remembered in the ghost."""
        self._remember([b for b in blocks if self.small.is_stamped(b)], False)
        if self.ghosts_main:
            self._remember([b for b in blocks if self.main.is_stamped(b)], True)
        self.small.discard(blocks)
        self.main.discard(blocks)

    def _small_share(self) -> int:
        """Blocks probation may hold before eviction takes its oldest: `small_fraction` of them all."""
        return int(self.small_fraction * (self.small.stamped + self.main.stamped))

    def _ghost_hit(self, from_main: bool) -> None:
        """A block was stored under a hash in the ghost (evicted from main when `from_main`, else
        from probation), already taken out of it. S3-FIFO only promotes such a block."""

    def _small_excess(self) -> int:
        """Blocks probation holds beyond its share (<= 0 when within it)."""
        return self.small.stamped - self._small_share()

    def pop_oldest(self, k: int) -> list[int]:
        """Remove and return k members in eviction order (fewer when there are fewer)."""
        out = self._pop_small(min(k, max(0, self._small_excess())))
        if len(out) < k:
            out += self._pop_within_share(k - len(out))
        return out

    def _pop_within_share(self, k: int) -> list[int]:
        """k members (fewer when there are fewer) once probation is within its share: the demoted
        ones first (EvictionOrder.demote: before every other member), then main's oldest, then, when
        main ran dry (or holds only pinned blocks), probation's."""
        out = self._pop_small(k, _DEMOTED)
        out += self._pop_main(k - len(out))
        if len(out) < k:
            out += self._pop_small(k - len(out))
        return out

    def _pop_small(self, k: int, before: float = float("inf")) -> list[int]:
        out = self.small.pop_oldest(k, before)
        self._remember(out, False)
        return out

    def _pop_main(self, k: int, before: float = float("inf")) -> list[int]:
        out = self.main.pop_oldest(k, before)
        if self.ghosts_main:
            self._remember(out, True)
        return out

    def oldest(self, n: int) -> list[int]:
        """About the next n members pop_oldest would take, in that order; removes none. Exact up to
        the point where probation's share would change queue mid-way."""
        if self._small_excess() > 0:
            out = self.small.oldest(n)  # demoted members lead probation
            return out + self.main.oldest(n - len(out))
        small = self.small.oldest_released(n)
        demoted = [b for when, b in small if when < _DEMOTED]
        out = demoted + self.main.oldest(n - len(demoted))
        return out + [b for _, b in small[len(demoted):]][: n - len(out)]

    def released_before(self, cutoff: float) -> list[int]:
        """Members released strictly before `cutoff`: probation's, then main's, each oldest first."""
        return self.small.released_before(cutoff) + self.main.released_before(cutoff)

    def members(self) -> list[int]:
        return self.small.members() + self.main.members()

    def _remember(self, blocks: list[int], from_main: bool) -> None:
        ghost, hashes = self._ghost, self._hashes
        for b in blocks:
            # A hash ghosted twice counts once, as from where it left last.
            self.ghosted_main += from_main - ghost.pop(hashes[b], False)  # type: ignore[arg-type]  # hashed
            ghost[hashes[b]] = from_main  # type: ignore[index]  # evicted blocks still carry their hash here
        for _ in range(len(ghost) - self._ghost_cap):
            self.ghosted_main -= ghost.popitem(last=False)[1]

    def check_invariants(self) -> None:
        """Both queues' invariants, no block in both, a bounded ghost."""
        self.small.check_invariants()
        self.main.check_invariants()
        both = [b for b in range(len(self._hashes)) if self.small.is_stamped(b) and self.main.is_stamped(b)]
        assert not both, f"blocks stamped in both queues: {both[:10]}"
        assert len(self._ghost) <= self._ghost_cap, f"ghost holds {len(self._ghost)} > {self._ghost_cap}"
        from_main = sum(self._ghost.values())
        assert from_main == self.ghosted_main, f"ghost: {from_main} hashes from main, counter {self.ghosted_main}"
