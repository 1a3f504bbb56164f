"""Speculative holders: blocks a node was routed and will hold once its prefill ends.

The global index learns of new blocks only when the node's events arrive; requests routed before
then (a burst of siblings, a conversation's next turn while the last one still waits in the queue)
would scatter. The router (or simulator) records each decision here and merges `match` with the
index's answer. A decision is a hold: it stands while its request waits, however long (a fixed TTL
was outrun by queues), until the first token (`release`; then `ttl_s` more for the events to reach
the index) or a failure (`release(failed=True)`: at once), at most `max_hold_s`. A plain record
(`add`, Ray Serve's router, which has no index) lasts `ttl_s`.

A record is marked computed once its node answered with a first token: from then a peer may pull
those blocks before the index knows them (a holder still computing would answer a pull with nothing,
and the puller recompute what it paid to pull).
"""

import heapq
import itertools
import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.ids import NodeId

DEFAULT_MAX_HOLD_S = 300.0
"""A hold whose request never answers ends this long after routing (a lost completion's bound)."""


@dataclass(slots=True, eq=False)
class PendingHold:
    """One routed request's record: `node` will hold `hashes` (its prompt's chain from block 0)."""

    node: NodeId
    hashes: tuple[BlockHash, ...]
    expiry: float
    """When the record ends, on the index's clock."""
    open: bool
    """Its request is in flight and has not answered (expiry is then the max_hold_s bound)."""


class PendingIndex:
    """hash -> {node: live records covering it}; the records are holds, each with its own expiry."""

    def __init__(self, ttl_s: float, clock: Callable[[], float], *, max_hold_s: float = DEFAULT_MAX_HOLD_S) -> None:
        for name, seconds in (("ttl_s", ttl_s), ("max_hold_s", max_hold_s)):
            if not (math.isfinite(seconds) and seconds > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {seconds}")
        self.ttl_s = ttl_s
        self.max_hold_s = max_hold_s
        self._clock = clock
        self._holders: dict[BlockHash, dict[NodeId, int]] = {}
        self._computed: dict[BlockHash, dict[NodeId, None]] = {}
        """The (hash, node) pairs whose node has computed the block; a subset of _holders. Dicts, not
        sets, here and in `match`: a set of node ids iterates in string-hash order (PYTHONHASHSEED),
        and `match`'s order becomes the candidates' order, which round robin and random tie-breaks
        read."""
        self._live: dict[PendingHold, None] = {}
        # Expiry heap; stale items (a hold released since, or gone) are skipped when popped.
        self._heap: list[tuple[float, int, PendingHold]] = []
        self._seq = itertools.count()

    def __len__(self) -> int:
        """(hash, node) pairs pending."""
        return sum(len(h) for h in self._holders.values())

    def hold(self, node: NodeId, hashes: Sequence[BlockHash]) -> PendingHold:
        """`node` was sent a request for `hashes`: pending until `release`, at most max_hold_s."""
        return self._insert(PendingHold(node, tuple(hashes), self._clock() + self.max_hold_s, True))

    def add(self, node: NodeId, hashes: Sequence[BlockHash]) -> PendingHold:
        """`node` will hold `hashes` for ttl_s from now (no request to wait for)."""
        return self._insert(PendingHold(node, tuple(hashes), self._clock() + self.ttl_s, False))

    def release(self, hold: PendingHold, *, failed: bool = False) -> None:
        """`hold`'s request answered (its record ends ttl_s from now) or `failed` (it ends now: the
        node will not hold what it was not given to compute). A record already gone is left alone."""
        if hold not in self._live:
            return
        if failed:
            self._drop(hold)
        elif hold.open:
            hold.open = False
            hold.expiry = self._clock() + self.ttl_s
            heapq.heappush(self._heap, (hold.expiry, next(self._seq), hold))

    def computed(self, node: NodeId, hashes: Sequence[BlockHash]) -> None:
        """`node` has computed `hashes` (its request's first token came back): the records it holds
        for them become pullable until they end."""
        for h in hashes:
            if node in self._holders.get(h, ()):
                self._computed.setdefault(h, {})[node] = None

    def match(self, hashes: Sequence[BlockHash], *, computed: bool = False) -> dict[NodeId, int]:
        """Per node, the contiguous prefix of `hashes` it is pending for (nodes with 0 are left out);
        `computed`: only the part its node has computed already."""
        self.expire()

        def holders(h: BlockHash) -> Collection[NodeId]:
            return self._computed.get(h, ()) if computed else self._holders.get(h, {})

        if not hashes:
            return {}
        alive = dict.fromkeys(holders(hashes[0]))
        out: dict[NodeId, int] = {}
        depth = 1
        for h in hashes[1:]:
            if not alive:
                break
            present = holders(h)
            for n in [n for n in alive if n not in present]:
                out[n] = depth
                del alive[n]
            depth += 1
        out.update(dict.fromkeys(alive, depth))
        return out

    def expire(self) -> int:
        """End the records past their expiry; returns how many (hash, node) pairs went."""
        now, heap, before = self._clock(), self._heap, len(self)
        while heap and heap[0][0] <= now:
            expiry, _, hold = heapq.heappop(heap)
            if hold in self._live and hold.expiry == expiry:
                self._drop(hold)
        return before - len(self)

    def _insert(self, hold: PendingHold) -> PendingHold:
        self._live[hold] = None
        for h in hold.hashes:
            holders = self._holders.setdefault(h, {})
            holders[hold.node] = holders.get(hold.node, 0) + 1
        heapq.heappush(self._heap, (hold.expiry, next(self._seq), hold))
        return hold

    def _drop(self, hold: PendingHold) -> None:
        del self._live[hold]
        node = hold.node
        for h in hold.hashes:
            holders = self._holders[h]
            holders[node] -= 1
            if holders[node]:
                continue
            del holders[node]
            if not holders:
                del self._holders[h]
            done = self._computed.get(h)
            if done is not None:
                done.pop(node, None)
                if not done:
                    del self._computed[h]

    def check_invariants(self) -> None:
        """The counts are the live holds' coverage; every live hold has a heap item with its expiry;
        computed pairs are pending ones."""
        counts: dict[tuple[BlockHash, NodeId], int] = {}
        for hold in self._live:
            for h in hold.hashes:
                counts[(h, hold.node)] = counts.get((h, hold.node), 0) + 1
        held = {(h, n): c for h, holders in self._holders.items() for n, c in holders.items()}
        assert held == counts, f"{len(held)} pending pairs drifted from the {len(self._live)} live holds' {len(counts)}"
        in_heap = {(id(hold), expiry) for expiry, _, hold in self._heap}
        for hold in self._live:
            assert (id(hold), hold.expiry) in in_heap, f"hold on {hold.node} ({hold.expiry}) has no heap item"
        for h, done in self._computed.items():
            assert done and done.keys() <= self._holders.get(h, {}).keys(), f"computed {h.hex()} without its record"
