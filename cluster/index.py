"""GlobalIndex: which node holds which prefix block, on which tier, partitioned by KV layout.

Chained hashes make a block's hash name its whole prefix, so `match` is a walk over a per-layout
dict `hash -> entry` (O(len(query) x nodes still matching)), never a tree descent from the root.
The radix structure (each entry's parent and children) keeps the chains, so a node's blocks can be
written back as chains for snapshots. An entry exists exactly while some node holds it; a child
whose parent entry is absent waits in `orphans[parent]` and is adopted when the parent appears.
Each node keeps the set of hashes it holds, so `drop_node` costs only that node's blocks.
"""

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from radixmesh.node_agent.block_hash import BlockHash
from radixmesh.node_agent.events import BlockRemoved, BlockStored, CacheEvent, Tier
from radixmesh.node_agent.ids import NodeId

logger = logging.getLogger(__name__)

TIER_BITS: dict[Tier, int] = {Tier.GPU: 1, Tier.HOST: 2}
_ALL_TIERS = 3
_ANY = 4  # match bookkeeping only: "still contiguous on some tier"


class PrefixLengths(NamedTuple):
    """Blocks 0..n-1 of a query held by one node: all on gpu, all on host, each on either."""

    gpu: int
    host: int
    any_tier: int


class IndexMatch(NamedTuple):
    cluster_blocks: int
    """Blocks 0..n-1 of the query each held by some node."""
    prefixes: dict[NodeId, PrefixLengths]
    """Every node holding block 0 on some tier."""


class _Entry:
    __slots__ = ("children", "holders", "parent")

    def __init__(self, parent: BlockHash | None) -> None:
        self.parent = parent
        self.children: set[BlockHash] | None = None  # most entries are leaves: no set until needed
        self.holders: dict[NodeId, int] = {}  # node -> TIER_BITS mask, never 0


@dataclass(slots=True)
class _Partition:
    entries: dict[BlockHash, _Entry] = field(default_factory=dict)
    orphans: dict[BlockHash, set[BlockHash]] = field(default_factory=dict)


class GlobalIndex:
    """The cluster's radix index of prefix blocks. Not thread-safe: one event loop owns it."""

    def __init__(self) -> None:
        self._parts: dict[str, _Partition] = {}
        self._node_layout: dict[NodeId, str] = {}
        self._node_blocks: dict[NodeId, set[BlockHash]] = {}

    def add_node(self, node: NodeId, layout: str) -> None:
        """Attach `node` to a layout partition. Idempotent; ValueError if it is in another layout."""
        known = self._node_layout.get(node)
        if known is not None and known != layout:
            raise ValueError(f"node {node} is in layout {known}, not {layout}: drop it first")
        if not layout:
            raise ValueError("layout fingerprint must be non-empty")
        self._node_layout[node] = layout
        self._node_blocks.setdefault(node, set())
        self._parts.setdefault(layout, _Partition())

    def nodes(self) -> list[NodeId]:
        return list(self._node_layout)

    def node_block_count(self, node: NodeId) -> int:
        return len(self._node_blocks.get(node, ()))

    def __len__(self) -> int:
        return sum(len(p.entries) for p in self._parts.values())

    def check_chains(self, node: NodeId, chains: Iterable[tuple[Sequence[BlockHash], BlockHash | None]]) -> None:
        """Raise ValueError if inserting these (hashes, parent) chains for `node` would contradict
        a known parent link or each other; changes nothing."""
        part = self._partition_of(node)
        claimed: dict[BlockHash, BlockHash | None] = {}
        for hashes, parent in chains:
            prev = parent
            for h in hashes:
                if h == prev:
                    raise ValueError("a block cannot be its own parent")
                entry = part.entries.get(h)
                known = claimed.get(h, entry.parent if entry is not None else prev)
                if known != prev:
                    raise ValueError(f"block {h.hex()} already has another parent in this layout")
                claimed[h] = prev
                prev = h

    def insert(self, node: NodeId, hashes: Sequence[BlockHash], parent: BlockHash | None, tier: Tier) -> None:
        """`node` holds the chain `hashes` (hashes[0]'s parent is `parent`) on `tier`.

        Validates first (`check_chains`), so a refused chain changes nothing.
        """
        self.check_chains(node, [(hashes, parent)])
        self._insert(node, hashes, parent, tier)

    def apply(self, node: NodeId, events: Sequence[CacheEvent]) -> None:
        """Apply one batch of `node`'s cache events in order, all or nothing (ValueError)."""
        self.check_chains(node, [(e.hashes, e.parent) for e in events if isinstance(e, BlockStored)])
        for event in events:
            if isinstance(event, BlockStored):
                self._insert(node, event.hashes, event.parent, event.tier)
            elif isinstance(event, BlockRemoved):
                self.remove(node, event.hashes, event.tier)
            else:
                self.clear_node(node)

    def replace(self, node: NodeId, chains: Sequence[BlockStored]) -> None:
        """Make `chains` the whole block set of `node`, all or nothing (ValueError)."""
        self.check_chains(node, [(c.hashes, c.parent) for c in chains])
        self.clear_node(node)
        for c in chains:
            self._insert(node, c.hashes, c.parent, c.tier)

    def remove(self, node: NodeId, hashes: Iterable[BlockHash], tier: Tier) -> None:
        """`node` no longer holds `hashes` on `tier`; blocks it does not hold there are skipped."""
        part = self._partition_of(node)
        clear = ~TIER_BITS[tier]
        held = self._node_blocks[node]
        for h in hashes:
            entry = part.entries.get(h)
            if entry is None or node not in entry.holders:
                continue
            bits = entry.holders[node] & clear
            if bits:
                entry.holders[node] = bits
                continue
            del entry.holders[node]
            held.discard(h)
            if not entry.holders:
                self._delete(part, h, entry)

    def clear_node(self, node: NodeId) -> None:
        """Forget every block of `node`, keeping it attached to its layout."""
        part = self._partition_of(node)
        held = self._node_blocks[node]
        for h in held:
            entry = part.entries[h]
            del entry.holders[node]
            if not entry.holders:
                self._delete(part, h, entry)
        held.clear()

    def drop_node(self, node: NodeId) -> None:
        """Forget `node` entirely; O(blocks it holds). Unknown nodes are a no-op."""
        if node not in self._node_layout:
            return
        self.clear_node(node)
        del self._node_blocks[node]
        del self._node_layout[node]

    def match(self, layout: str, hashes: Sequence[BlockHash]) -> IndexMatch:
        """Each node's contiguous prefix of `hashes` by tier, and the cluster-wide prefix."""
        part = self._parts.get(layout)
        if part is None or not hashes:
            return IndexMatch(0, {})
        entries = part.entries
        first = entries.get(hashes[0])
        if first is None:
            return IndexMatch(0, {})
        # alive[node] = tiers (plus _ANY) on which the node is still contiguous at this depth.
        alive = {n: bits | _ANY for n, bits in first.holders.items()}
        lengths = {n: [0, 0, 0] for n in alive}
        prev = first.holders
        depth = 1
        for h in hashes[1:]:
            entry = entries.get(h)
            if entry is None:
                break
            holders = entry.holders
            # Along a chain the holders rarely change; equal holders (compared in C) change no
            # alive bits, because those are already a subset of the previous holders' bits.
            if alive and holders != prev:
                ended = None
                for n, bits in alive.items():
                    hb = holders.get(n, 0)
                    kept = bits & (hb | _ANY) if hb else 0
                    if kept != bits:
                        _record(lengths[n], bits & ~kept, depth)
                        if kept:
                            alive[n] = kept
                        elif ended is None:
                            ended = [n]
                        else:
                            ended.append(n)
                for n in ended or ():
                    del alive[n]
            prev = holders
            depth += 1
        for n, bits in alive.items():
            _record(lengths[n], bits, depth)
        prefixes = {n: PrefixLengths(g, ho, a) for n, (g, ho, a) in lengths.items()}
        return IndexMatch(depth, prefixes)

    def node_chains(self, node: NodeId) -> list[BlockStored]:
        """`node`'s blocks as stored chains (per tier), enough to rebuild them with `insert`."""
        part = self._partition_of(node)
        out: list[BlockStored] = []
        for tier, bit in TIER_BITS.items():
            on_tier = {h for h in self._node_blocks[node] if part.entries[h].holders[node] & bit}
            seen: set[BlockHash] = set()
            roots = [h for h in on_tier if part.entries[h].parent not in on_tier]
            while roots:
                root = roots.pop()
                chain = [root]
                seen.add(root)
                kids = self._kids_on(part, root, on_tier, seen)
                while kids:
                    roots.extend(kids[1:])  # a branch starts a chain of its own under this block
                    chain.append(kids[0])
                    seen.add(kids[0])
                    kids = self._kids_on(part, kids[0], on_tier, seen)
                out.append(BlockStored(tuple(chain), part.entries[root].parent, tier))
            # Only a parent cycle (impossible with real chained hashes) leaves blocks unseen.
            out.extend(BlockStored((h,), part.entries[h].parent, tier) for h in on_tier - seen)
        return out

    def check_invariants(self) -> None:
        """Raise AssertionError with the numbers if the structure is inconsistent."""
        counted: dict[NodeId, int] = dict.fromkeys(self._node_blocks, 0)
        for layout, part in self._parts.items():
            for h, entry in part.entries.items():
                assert entry.holders, f"entry {h.hex()} in {layout} has no holder"
                for n, bits in entry.holders.items():
                    assert 0 < bits <= _ALL_TIERS, f"holder {n} of {h.hex()} has tier bits {bits}"
                    assert self._node_layout.get(n) == layout, f"holder {n} not in layout {layout}"
                    assert h in self._node_blocks[n], f"{h.hex()} missing from {n}'s block set"
                    counted[n] += 1
                p = entry.parent
                if p is not None and p in part.entries:
                    assert h in (part.entries[p].children or ()), f"{h.hex()} not linked to parent"
                elif p is not None:
                    assert h in part.orphans.get(p, ()), f"{h.hex()} neither linked nor orphaned"
                for c in entry.children or ():
                    assert part.entries[c].parent == h, f"child {c.hex()} has another parent"
            for p, kids in part.orphans.items():
                assert kids and p not in part.entries, f"orphan set of {p.hex()}: {len(kids)} present"
                assert all(part.entries[c].parent == p for c in kids), "orphan with another parent"
        for n, held in self._node_blocks.items():
            assert counted[n] == len(held), f"node {n}: {counted[n]} holder marks, {len(held)} in set"

    def _insert(self, node: NodeId, hashes: Sequence[BlockHash], parent: BlockHash | None, tier: Tier) -> None:
        part = self._partition_of(node)
        bit = TIER_BITS[tier]
        held = self._node_blocks[node]
        entries, orphans = part.entries, part.orphans
        prev = parent
        up = entries.get(parent) if parent is not None else None
        for h in hashes:
            entry = entries.get(h)
            if entry is None:
                # _create inlined: this loop is the ingest hot path.
                entry = entries[h] = _Entry(prev)
                entry.holders[node] = bit
                if orphans:
                    entry.children = orphans.pop(h, None)
                if up is not None:
                    if up.children is None:
                        up.children = {h}
                    else:
                        up.children.add(h)
                elif prev is not None:
                    orphans.setdefault(prev, set()).add(h)
            else:
                holders = entry.holders
                holders[node] = holders.get(node, 0) | bit
            held.add(h)
            prev = h
            up = entry

    def _partition_of(self, node: NodeId) -> _Partition:
        layout = self._node_layout.get(node)
        if layout is None:
            raise ValueError(f"node {node} is not in the index: add_node first")
        return self._parts[layout]

    @staticmethod
    def _delete(part: _Partition, h: BlockHash, entry: _Entry) -> None:
        del part.entries[h]
        if entry.children:
            part.orphans[h] = entry.children
        p = entry.parent
        if p is None:
            return
        up = part.entries.get(p)
        siblings = up.children if up is not None else part.orphans.get(p)
        assert siblings is not None and h in siblings, f"{h.hex()} unlinked from its parent"
        siblings.discard(h)
        if up is None and not siblings:
            del part.orphans[p]

    @staticmethod
    def _kids_on(part: _Partition, h: BlockHash, on_tier: set[BlockHash], seen: set[BlockHash]) -> list[BlockHash]:
        kids = part.entries[h].children or ()
        return [c for c in kids if c in on_tier and c not in seen]


def _record(lengths: list[int], ended_bits: int, depth: int) -> None:
    """Write `depth` as the prefix length of every tier slot in `ended_bits`."""
    if ended_bits & 1:
        lengths[0] = depth
    if ended_bits & 2:
        lengths[1] = depth
    if ended_bits & _ANY:
        lengths[2] = depth
