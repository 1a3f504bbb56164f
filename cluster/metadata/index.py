"""GlobalIndex: which node holds which prefix block, on which tier, partitioned by KV layout.

`match` is a walk over a per-layout dict `hash -> holder mask` (chained hashes make a block's hash
name its whole prefix), never a tree descent. The tree is kept as parent links per node, which
`check_chains` holds each node's events to; holders are bit masks over per-layout node slots; with
`recall_blocks` each layout keeps the cluster's ghost (RecallWindow). Why each:
docs/routing.md#the-global-index.
"""

from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from itertools import groupby, islice, repeat, takewhile
from operator import eq, or_
from typing import NamedTuple, cast

from radixmesh.cluster.metadata.holder_masks import (
    SLOT_BITS,
    SLOT_MASK,
    TIER_SHIFT,
    Holder,
    Partition,
    bits,
    fold,
    fold_fast,
)
from radixmesh.common.block_pool.recall import RecallWindow
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.events import AllCleared, BlockRemoved, BlockStored, CacheEvent, Tier
from radixmesh.proto.ids import NodeId

Chain = tuple[Sequence[BlockHash], BlockHash | None]


class PrefixLengths(NamedTuple):
    """Blocks 0..n-1 of a query held by one node: all on gpu; each on gpu or host (served without the
    disk); each on some tier (gpu, host or disk). Blocks host..any_tier-1 begin with one only the disk
    holds: the router prices that tail at the node's disk read rate."""

    gpu: int
    host: int
    any_tier: int


class IndexMatch(NamedTuple):
    cluster_blocks: int
    """Blocks 0..n-1 of the query each held by some node."""
    prefixes: dict[NodeId, PrefixLengths]
    """Every node holding block 0 on some tier."""


class GlobalIndex:
    """The cluster's radix index of prefix blocks. Not thread-safe: one event loop owns it."""

    def __init__(self, recall_blocks: int = 0) -> None:
        """`recall_blocks`: last-copy evictions remembered per layout (0: none; see `recalled`)."""
        if recall_blocks < 0:
            raise ValueError(f"recall_blocks must be >= 0, got {recall_blocks}")
        self._parts: dict[str, Partition] = {}
        self._holders: dict[NodeId, Holder] = {}
        self._recall_blocks = recall_blocks

    def add_node(self, node: NodeId, layout: str) -> None:
        """Attach `node` to a layout partition. Idempotent; ValueError if it is in another layout."""
        known = self._holders.get(node)
        if known is not None:
            if known.layout != layout:
                raise ValueError(f"node {node} is in layout {known.layout}, not {layout}: drop it first")
            return
        if not layout:
            raise ValueError("layout fingerprint must be non-empty")
        part = self._parts.get(layout)
        if part is None:
            part = self._parts[layout] = Partition(lost=RecallWindow(self._recall_blocks))
        self._holders[node] = Holder(layout, part, part.take_slot(node))

    def nodes(self) -> list[NodeId]:
        return list(self._holders)

    def node_block_count(self, node: NodeId) -> int:
        m = self._holders.get(node)
        return len(m.parents) if m is not None else 0

    def __len__(self) -> int:
        return sum(len(p.masks) for p in self._parts.values())

    def check_chains(self, node: NodeId, chains: Iterable[Chain]) -> None:
        """Raise ValueError if inserting these (hashes, parent) chains for `node` would contradict
        a parent link of `node` or each other, or make a block its own parent; changes nothing."""
        parents = self._holder(node).parents
        hs: list[BlockHash] = []
        prevs: list[BlockHash | None] = []
        for hashes, parent in chains:
            if hashes:
                hs.extend(hashes)
                prevs.append(parent)
                prevs.extend(islice(hashes, len(hashes) - 1))
        # The common case in three C-level passes: no block twice (so none is its own parent
        # inside a chain), no chain under itself, every known parent link the same. Otherwise the
        # loop decides and names the culprit: a block twice with the same parent is fine.
        if (
            len(set(hs)) == len(hs)
            and list(map(parents.get, hs, prevs)) == prevs
            and not any(map(eq, hs, prevs))
        ):
            return
        claimed: dict[BlockHash, BlockHash | None] = {}
        for h, prev in zip(hs, prevs):
            if h == prev:
                raise ValueError("a block cannot be its own parent")
            if claimed.setdefault(h, parents.get(h, prev)) != prev:
                raise ValueError(f"block {h.hex()} already has another parent on node {node}")

    def insert(self, node: NodeId, hashes: Sequence[BlockHash], parent: BlockHash | None, tier: Tier) -> None:
        """`node` holds the chain `hashes` (hashes[0]'s parent is `parent`) on `tier`.

        Validates first (`check_chains`), so a refused chain changes nothing.
        """
        self.check_chains(node, [(hashes, parent)])
        self._insert(self._holders[node], hashes, parent, tier)

    def apply(self, node: NodeId, events: Sequence[CacheEvent]) -> None:
        """Apply one batch of `node`'s cache events in order, all or nothing (ValueError)."""
        self.check_chains(node, [(e.hashes, e.parent) for e in events if isinstance(e, BlockStored)])
        holder = self._holders[node]
        for event in events:
            if isinstance(event, BlockStored):
                self._insert(holder, event.hashes, event.parent, event.tier)
            elif isinstance(event, BlockRemoved):
                self._remove(holder, event.hashes, event.tier)
            else:
                self._clear(holder)

    def replace(self, node: NodeId, chains: Sequence[BlockStored]) -> None:
        """Make `chains` the whole block set of `node`, all or nothing (ValueError)."""
        self.check_chains(node, [(c.hashes, c.parent) for c in chains])
        holder = self._holders[node]
        self._clear(holder)
        for c in chains:
            self._insert(holder, c.hashes, c.parent, c.tier)

    def remove(self, node: NodeId, hashes: Iterable[BlockHash], tier: Tier) -> None:
        """`node` no longer holds `hashes` on `tier`; blocks it does not hold there are skipped."""
        self._remove(self._holder(node), hashes, tier)

    def drop_node(self, node: NodeId) -> None:
        """Forget `node` entirely; O(blocks it holds). Unknown nodes are a no-op."""
        holder = self._holders.pop(node, None)
        if holder is None:
            return
        self._clear(holder)
        holder.part.slots[holder.slot] = None  # its bits are clear in every mask: safe to reuse

    def match(self, layout: str, hashes: Sequence[BlockHash]) -> IndexMatch:
        """Each node's contiguous prefix of `hashes` by tier, and the cluster-wide prefix."""
        part = self._parts.get(layout)
        if part is None or not hashes:
            return IndexMatch(0, {})
        masks = part.masks
        first = masks.get(hashes[0])
        if first is None:
            return IndexMatch(0, {})
        # The masks of blocks 0..depth-1 (takewhile stops at the first block nobody holds).
        found = cast(list[int], list(takewhile(bool, map(masks.get, hashes))))
        depth = len(found)
        gpu_bits = part.gpu_bits
        firsts = (first & gpu_bits, fold_fast(first, gpu_bits), fold(first, gpu_bits))
        # Where a node's prefix on gpu, on gpu or host, on some tier ends early, keyed by its slot's
        # gpu bit. Along a chain the holders rarely change: most queries see one mask (counted in C)
        # and skip this; otherwise the walk goes run by run of equal masks, not block by block.
        ends: tuple[dict[int, int], ...] = ({}, {}, {})
        if found.count(first) != depth:
            alive = list(firsts)
            pos = 0
            for mask, run in groupby(found):
                for i, held in enumerate((mask & gpu_bits, fold_fast(mask, gpu_bits), fold(mask, gpu_bits))):
                    lost = alive[i] & ~held
                    if lost:
                        ends[i].update(dict.fromkeys(bits(lost), pos))
                        alive[i] ^= lost
                pos += len(list(run))
        slots = part.slots
        prefixes = {}
        for b in bits(firsts[2]):
            prefixes[slots[b // SLOT_BITS]] = PrefixLengths(
                *(ends[i].get(b, depth) if firsts[i] >> b & 1 else 0 for i in range(3)))
        return IndexMatch(depth, prefixes)  # type: ignore[arg-type]

    def recalled(self, layout: str, block_hash: BlockHash) -> bool:
        """Whether the layout's last copy of `block_hash` was among its `recall_blocks` latest
        last-copy evictions, and no node holds it now."""
        part = self._parts.get(layout)
        return part is not None and block_hash in part.lost and block_hash not in part.masks

    def lost_since(self, layout: str, cursor: int, limit: int) -> tuple[list[BlockHash], int]:
        """The layout's hashes lost after `cursor` (0: from the start) that no node holds now, oldest
        first, at most the newest `limit` losses; and the cursor to pass next (`RecallWindow.since`)."""
        part = self._parts.get(layout)
        if part is None:
            return [], cursor
        lost, cursor = part.lost.since(cursor, limit)
        return [h for h in lost if h not in part.masks], cursor

    def node_chains(self, node: NodeId) -> list[BlockStored]:
        """`node`'s blocks as stored chains (per tier), enough to rebuild them with `insert`."""
        return self.frozen_chains([node])[node]()

    def frozen_chains(self, nodes: Iterable[NodeId]) -> dict[NodeId, Callable[[], list[BlockStored]]]:
        """`node_chains` of each of `nodes` as of now, computed when called: what they read is copied
        here, in C-level passes, so another thread may call them while the index changes."""
        holders = {node: self._holder(node) for node in nodes}
        held: dict[str, int] = {}
        for holder in holders.values():
            held[holder.layout] = held.get(holder.layout, 0) + len(holder.parents)
        # A lookup in a large dict costs several copies of an entry (cache misses: ~5x measured), so
        # for nodes holding a quarter of their partition or more, one copy of its masks serves them all.
        shared = {layout: dict(self._parts[layout].masks) for layout, n in held.items()
                  if 4 * n >= len(self._parts[layout].masks)}
        out: dict[NodeId, Callable[[], list[BlockStored]]] = {}
        for node, holder in holders.items():
            parents = dict(holder.parents)
            masks = shared.get(holder.layout)
            if masks is None:
                masks = dict(zip(parents, map(holder.part.masks.__getitem__, parents)))
            out[node] = partial(_chains, parents, masks, SLOT_BITS * holder.slot)
        return out

    def held_after(self, node: NodeId, events: Sequence[CacheEvent]) -> int:
        """How many blocks `node` would hold (on some tier) once `events` were applied; changes nothing."""
        holder = self._holder(node)
        held = len(holder.parents)
        if not any(isinstance(e, BlockRemoved | AllCleared) for e in events):
            return held + len(_stored(events).difference(holder.parents))
        masks, shift = holder.part.masks, SLOT_BITS * holder.slot
        tiers: dict[BlockHash, int] = {}
        """The node's tier bits of every block the events touched, as of the event being read."""
        cleared = False
        for e in events:
            if isinstance(e, AllCleared):
                tiers.clear()
                held, cleared = 0, True
                continue
            bit = 1 << TIER_SHIFT[e.tier]
            for h in e.hashes:
                old = tiers[h] if h in tiers else 0 if cleared else masks.get(h, 0) >> shift & SLOT_MASK
                new = old | bit if isinstance(e, BlockStored) else old & ~bit
                tiers[h] = new
                held += (new != 0) - (old != 0)
        return held

    def check_invariants(self) -> None:
        """Raise AssertionError with the numbers if the structure is inconsistent."""
        counted: dict[NodeId, int] = dict.fromkeys(self._holders, 0)
        for layout, part in self._parts.items():
            assert part.gpu_bits == sum(1 << (SLOT_BITS * s) for s in range(len(part.slots))), f"{layout}: gpu_bits"
            for s, n in enumerate(part.slots):
                m = self._holders.get(n) if n is not None else None
                assert n is None or (m is not None and m.slot == s and m.part is part), f"slot {s}: {n}"
            for h, mask in part.masks.items():
                assert mask > 0, f"entry {h.hex()} in {layout} has holder mask {mask}"
                for slot in (b // SLOT_BITS for b in bits(fold(mask, part.gpu_bits))):
                    n = part.slots[slot] if slot < len(part.slots) else None
                    assert n is not None, f"{h.hex()} held by free slot {slot} in {layout}"
                    assert h in self._holders[n].parents, f"{h.hex()} missing from {n}'s block set"
                    counted[n] += 1
            part.lost.check_invariants()
        for n, holder in self._holders.items():
            assert holder.part is self._parts[holder.layout], f"node {n} attached to another partition"
            assert counted[n] == len(holder.parents), f"{n}: {counted[n]} holder marks, {len(holder.parents)} held"
            assert all(h != p for h, p in holder.parents.items()), f"{n}: a block is its own parent"

    def _holder(self, node: NodeId) -> Holder:
        holder = self._holders.get(node)
        if holder is None:
            raise ValueError(f"node {node} is not in the index: add_node first")
        return holder

    @staticmethod
    def _insert(holder: Holder, hashes: Sequence[BlockHash], parent: BlockHash | None, tier: Tier) -> None:
        if not hashes:
            return
        part, bit = holder.part, holder.bit(tier)
        masks = part.masks
        # Two C-level passes; check_chains made every new parent link agree with the node's own.
        holder.parents.update(zip(hashes, (parent, *hashes[:-1])))
        masks.update(zip(hashes, map(or_, map(masks.get, hashes, repeat(0)), repeat(bit))))

    @staticmethod
    def _remove(holder: Holder, hashes: Iterable[BlockHash], tier: Tier) -> None:
        part, bit, every = holder.part, holder.bit(tier), holder.all_bits
        masks, held = part.masks, holder.parents
        for h in hashes:
            mask = masks.get(h, 0)
            if not mask & bit:
                continue
            mask ^= bit
            if mask:
                masks[h] = mask
            else:
                del masks[h]
                part.lost.lose((h,))
            if not mask & every:
                del held[h]

    @staticmethod
    def _clear(holder: Holder) -> None:
        part, keep = holder.part, ~holder.all_bits
        masks = part.masks
        for h in holder.parents:
            mask = masks[h] & keep
            if mask:
                masks[h] = mask
            else:
                del masks[h]
        holder.parents.clear()


def _stored(events: Sequence[CacheEvent]) -> set[BlockHash]:
    """Every hash the BlockStored events of `events` name."""
    return {h for e in events if isinstance(e, BlockStored) for h in e.hashes}


def _chains(parents: dict[BlockHash, BlockHash | None], masks: Mapping[BlockHash, int], shift: int
            ) -> list[BlockStored]:
    """A node's blocks as stored chains per tier, from its parent links and the holder masks of (at
    least) its blocks, the node's tier bits at `shift`."""
    out: list[BlockStored] = []
    held = list(map(masks.__getitem__, parents))
    for tier, offset in TIER_SHIFT.items():
        bit = 1 << (shift + offset)
        # A dict, not a set: chains come out in the node's storing order, not in bytes-hash order
        # (PYTHONHASHSEED), so snapshots and what replicas rebuild from them are reproducible.
        on_tier = {h: None for h, mask in zip(parents, held) if mask & bit}
        kids: dict[BlockHash, list[BlockHash]] = {}
        roots = []
        for h in on_tier:
            p = parents[h]
            if p in on_tier:
                kids.setdefault(p, []).append(h)  # type: ignore[arg-type]
            else:
                roots.append(h)
        seen: set[BlockHash] = set()
        while roots:
            root = roots.pop()
            chain = [root]
            seen.add(root)
            below = kids.get(root)
            while below:
                roots.extend(below[1:])  # a branch starts a chain of its own under this block
                chain.append(below[0])
                seen.add(below[0])
                below = kids.get(below[0])
            out.append(BlockStored(tuple(chain), parents[root], tier))
        # Only a parent cycle (impossible with real chained hashes) leaves blocks unseen.
        if len(seen) < len(on_tier):
            out.extend(BlockStored((h,), parents[h], tier) for h in on_tier if h not in seen)
    return out
