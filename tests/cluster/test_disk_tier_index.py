"""The disk tier in the global index and on the wire: a disk holder holds the block (on the host
bit, priced like host for now), and TIER_DISK events round-trip through the codec."""

import pytest

from radixmesh.cluster.metadata.index import GlobalIndex, PrefixLengths
from radixmesh.proto import radixmesh_pb2 as pb
from radixmesh.proto.events import BlockRemoved, BlockStored, Tier
from radixmesh.proto.ids import NodeId
from radixmesh.proto.metadata.codec import event_from_pb, event_to_pb, tier_from_pb
from tests.support.hashes import h

LAYOUT = "L"
A = NodeId("a")
CHAIN = [h(i) for i in range(4)]


def test_a_disk_holder_holds_its_chain_as_host() -> None:
    index = GlobalIndex()
    index.add_node(A, LAYOUT)
    index.apply(A, [BlockStored(tuple(CHAIN[:2]), None, Tier.GPU), BlockStored(tuple(CHAIN[2:]), CHAIN[1], Tier.DISK)])
    assert index.match(LAYOUT, CHAIN) == (4, {A: PrefixLengths(gpu=2, host=0, any_tier=4)})
    assert index.node_block_count(A) == 4
    index.apply(A, [BlockRemoved((CHAIN[3],), Tier.DISK)])
    assert index.match(LAYOUT, CHAIN) == (3, {A: PrefixLengths(gpu=2, host=0, any_tier=3)})
    index.check_invariants()


def test_a_disk_block_must_agree_with_the_node_s_parent_links() -> None:
    """Why disk records carry their parent: a disk chain is held to the same links as the gpu's."""
    index = GlobalIndex()
    index.add_node(A, LAYOUT)
    index.apply(A, [BlockStored(tuple(CHAIN), None, Tier.GPU)])
    with pytest.raises(ValueError, match="another parent"):
        index.apply(A, [BlockStored((CHAIN[2],), None, Tier.DISK)])
    index.apply(A, [BlockStored((CHAIN[2],), CHAIN[1], Tier.DISK)])
    index.check_invariants()


def test_disk_events_cross_the_wire() -> None:
    stored = BlockStored(tuple(CHAIN), CHAIN[0], Tier.DISK)
    assert event_from_pb(event_to_pb(stored)) == stored
    assert tier_from_pb(pb.TIER_DISK) is Tier.DISK
    with pytest.raises(ValueError, match="TIER_DISK"):
        tier_from_pb(pb.TIER_UNSPECIFIED)
