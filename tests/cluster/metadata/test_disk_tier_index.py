"""The disk tier in the global index and on the wire: a disk holder holds the block (on a bit of its
own: counted in any_tier, not in the gpu-or-host run), and TIER_DISK events round-trip through the codec."""

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


def test_a_disk_holder_holds_its_chain_past_its_gpu_and_host_run() -> None:
    index = GlobalIndex()
    index.add_node(A, LAYOUT)
    index.apply(A, [BlockStored(tuple(CHAIN[:2]), None, Tier.GPU), BlockStored(tuple(CHAIN[2:]), CHAIN[1], Tier.DISK)])
    assert index.match(LAYOUT, CHAIN) == (4, {A: PrefixLengths(gpu=2, host=2, any_tier=4)})
    assert index.node_block_count(A) == 4
    index.apply(A, [BlockRemoved((CHAIN[3],), Tier.DISK)])
    assert index.match(LAYOUT, CHAIN) == (3, {A: PrefixLengths(gpu=2, host=2, any_tier=3)})
    index.check_invariants()


def test_a_block_on_host_and_disk_stays_held_when_one_of_them_drops_it() -> None:
    index = GlobalIndex()
    index.add_node(A, LAYOUT)
    index.apply(A, [BlockStored(tuple(CHAIN), None, Tier.HOST), BlockStored(tuple(CHAIN), None, Tier.DISK)])
    assert index.match(LAYOUT, CHAIN) == (4, {A: PrefixLengths(gpu=0, host=4, any_tier=4)})
    index.apply(A, [BlockRemoved(tuple(CHAIN[2:]), Tier.HOST)])  # the host evicted them to disk
    assert index.match(LAYOUT, CHAIN) == (4, {A: PrefixLengths(gpu=0, host=2, any_tier=4)})
    assert index.node_block_count(A) == 4
    index.apply(A, [BlockRemoved(tuple(CHAIN[3:]), Tier.DISK)])
    assert index.match(LAYOUT, CHAIN) == (3, {A: PrefixLengths(gpu=0, host=2, any_tier=3)})
    assert {e.tier: e.hashes for e in index.node_chains(A)} == {Tier.HOST: tuple(CHAIN[:2]),
                                                               Tier.DISK: tuple(CHAIN[:3])}
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
