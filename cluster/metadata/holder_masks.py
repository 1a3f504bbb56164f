"""Holder masks: which nodes of a layout hold a block, on which tier, as one int per block.

A node takes a slot in its layout's partition; in slot s it holds a block on gpu when bit
SLOT_BITS x s is set, on host when the next bit is, on disk when the one after is (TIER_SHIFT).
Masks are plain ints, so an index entry is two dict values and no Python object of its own: no
per-block allocation for the garbage collector to track or traverse.
"""

from collections.abc import Iterable
from dataclasses import dataclass, field

from radixmesh.common.block_pool.recall import RecallWindow
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.events import Tier
from radixmesh.proto.ids import NodeId

SLOT_BITS = 3
"""Bits per node slot in a block's holder mask: one per tier."""
TIER_SHIFT: dict[Tier, int] = {Tier.GPU: 0, Tier.HOST: 1, Tier.DISK: 2}
"""Offset of a tier's bit inside a node slot's bits. Disk has its own: a block both on host and on disk
stays held when either tier drops it, and the router prices a disk read apart from a host copy."""
SLOT_MASK = (1 << SLOT_BITS) - 1


@dataclass(slots=True)
class Partition:
    """One layout's blocks: `masks` has one key per indexed block, held by some node of the layout."""

    masks: dict[BlockHash, int] = field(default_factory=dict)
    slots: list[NodeId | None] = field(default_factory=list)
    """Node of each slot; None for a slot freed by `GlobalIndex.drop_node`, reused by the next node."""
    gpu_bits: int = 0
    """Bit SLOT_BITS x s set for every slot s ever used: folds a mask to one 'some tier' bit per node."""
    lost: RecallWindow = field(default_factory=lambda: RecallWindow(0))
    """Blocks the layout's last holder evicted recently."""

    def take_slot(self, node: NodeId) -> int:
        slot = next((s for s, n in enumerate(self.slots) if n is None), len(self.slots))
        if slot == len(self.slots):
            self.slots.append(node)
            self.gpu_bits |= 1 << (SLOT_BITS * slot)
        else:
            self.slots[slot] = node
        return slot


@dataclass(slots=True)
class Holder:
    """A node's place in its layout partition, and the blocks it holds."""

    layout: str
    part: Partition
    slot: int
    parents: dict[BlockHash, BlockHash | None] = field(default_factory=dict)
    """Every block the node holds on some tier, with the parent the node declared for it."""

    @property
    def all_bits(self) -> int:
        return SLOT_MASK << (SLOT_BITS * self.slot)

    def bit(self, tier: Tier) -> int:
        return 1 << (SLOT_BITS * self.slot + TIER_SHIFT[tier])


def fold_fast(mask: int, gpu_bits: int) -> int:
    """`mask` with each node's gpu and host bits folded onto its gpu bit: set where the node holds the
    block without its disk."""
    return (mask | mask >> 1) & gpu_bits


def fold(mask: int, gpu_bits: int) -> int:
    """`mask` with each node's slot folded onto its gpu bit: set where the node holds the block on
    some tier."""
    return (mask | mask >> 1 | mask >> 2) & gpu_bits


def bits(mask: int) -> Iterable[int]:
    """Positions of the set bits of `mask`, lowest first."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low
