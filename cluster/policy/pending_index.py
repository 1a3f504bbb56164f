"""Speculative holders: blocks a node was just routed and will hold once its prefill ends.

The global index learns of new blocks only when the node's events arrive; a burst of sibling
requests routed before then would scatter. The router (or simulator) records each decision here
and merges `match` with the index's answer, so siblings co-locate. Entries expire after `ttl_s` of
the injected clock: by then the real events have arrived (or the request failed).

A record is marked computed once its node answered the request with a first token (its prefill is
done): from then a peer may pull those blocks, before the node's events reach the index. A pending
holder that has not computed them would answer a pull with nothing, after which the puller
recomputes what it paid to pull.
"""

import heapq
import math
from collections.abc import Callable, Collection, Sequence

from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.ids import NodeId


class PendingIndex:
    """hash -> {node: expiry}; one record per (hash, node), renewed by a later add."""

    def __init__(self, ttl_s: float, clock: Callable[[], float]) -> None:
        if not (math.isfinite(ttl_s) and ttl_s > 0):
            raise ValueError(f"ttl_s must be a finite number > 0, got {ttl_s}")
        self.ttl_s = ttl_s
        self._clock = clock
        self._holders: dict[BlockHash, dict[NodeId, float]] = {}
        self._computed: dict[BlockHash, dict[NodeId, None]] = {}
        """The records (hash, node) whose node has computed the block; a subset of _holders. Dicts, not
        sets, here and in `match`: a set of node ids iterates in string-hash order (PYTHONHASHSEED),
        and `match`'s order becomes the candidates' order, which round robin and random tie-breaks
        read."""
        # Expiry heap; stale items (renewed or already gone) are skipped when popped.
        self._heap: list[tuple[float, BlockHash, NodeId]] = []

    def __len__(self) -> int:
        return sum(len(h) for h in self._holders.values())

    def add(self, node: NodeId, hashes: Sequence[BlockHash]) -> None:
        """`node` will hold `hashes` (a prompt's chain from block 0) until now + ttl."""
        expiry = self._clock() + self.ttl_s
        for h in hashes:
            self._holders.setdefault(h, {})[node] = expiry
            heapq.heappush(self._heap, (expiry, h, node))

    def computed(self, node: NodeId, hashes: Sequence[BlockHash]) -> None:
        """`node` has computed `hashes` (its request's first token came back): the records it holds
        for them become pullable until they expire."""
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
        """Drop records past their expiry; returns how many."""
        now, heap, dropped = self._clock(), self._heap, 0
        while heap and heap[0][0] <= now:
            expiry, h, node = heapq.heappop(heap)
            holders = self._holders.get(h)
            if holders is None or holders.get(node) != expiry:
                continue
            del holders[node]
            dropped += 1
            if not holders:
                del self._holders[h]
            done = self._computed.get(h)
            if done is not None:
                done.pop(node, None)
                if not done:
                    del self._computed[h]
        return dropped

    def check_invariants(self) -> None:
        """Every record has a heap item with its expiry; no hash has an empty holder map."""
        in_heap = {(h, n, e) for e, h, n in self._heap}
        for h, holders in self._holders.items():
            assert holders, f"hash {h.hex()} has an empty holder map"
            for n, e in holders.items():
                assert (h, n, e) in in_heap, f"record ({h.hex()}, {n}, {e}) has no heap item"
        assert len(self._heap) >= len(self), f"heap {len(self._heap)} < records {len(self)}"
        for h, done in self._computed.items():
            assert done and done.keys() <= self._holders.get(h, {}).keys(), f"computed {h.hex()} without its record"
