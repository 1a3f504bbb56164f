"""The cluster's ghost (RecallWindow) against a list model, and the lease that carries it."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixmesh.common.block_pool.recall import RecallWindow
from radixmesh.proto import radixmesh_pb2 as pb
from radixmesh.proto.ids import NodeId
from radixmesh.proto.metadata.codec import lease_from_pb, lease_to_pb
from radixmesh.proto.metadata.nodes import Lease
from tests.support.hashes import h

ops = st.lists(st.tuples(st.sampled_from(["lose", "take"]), st.lists(st.integers(0, 9), max_size=4)),
               max_size=40)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 5), ops, st.integers(0, 30), st.integers(0, 6))
def test_recall_window_against_a_list_model(capacity: int, steps: list[tuple[str, list[int]]],
                                            cursor: int, limit: int) -> None:
    """Model: a list of (hash, seq) in loss order; a loss moves the hash to the end with the next
    sequence number, then the oldest beyond capacity leave; take removes."""
    w = RecallWindow(capacity)
    model: list[tuple[int, int]] = []
    seq = 0
    for op, items in steps:
        if op == "lose":
            w.lose([h(i) for i in items])
            if capacity:
                for i in items:
                    seq += 1
                    model = [m for m in model if m[0] != i] + [(i, seq)]
                model = model[len(model) - capacity:] if len(model) > capacity else model
        else:
            for i in items:
                assert w.take(h(i)) == any(m[0] == i for m in model)
                model = [m for m in model if m[0] != i]
        w.check_invariants()
        assert [x for x in range(10) if h(x) in w] == sorted(m[0] for m in model) and len(w) == len(model)
    newer = [m[0] for m in model if m[1] > cursor]
    assert w.since(cursor, limit) == ([h(i) for i in newer[max(0, len(newer) - limit):]], seq)


def test_bad_capacity_is_refused() -> None:
    with pytest.raises(ValueError, match="capacity"):
        RecallWindow(-1)


def test_lease_carries_recalled_hashes_and_refuses_bad_ones() -> None:
    lease = Lease(NodeId("a"), 1, 10.0, 1, False, (h(1), h(2)))
    assert lease_from_pb(lease_to_pb(lease)) == lease
    bad = pb.Lease(node_id="a", epoch=1, ttl_s=10.0, next_seq=1, recalled=[b"short"])
    with pytest.raises(ValueError, match="16 bytes"):
        lease_from_pb(bad)
