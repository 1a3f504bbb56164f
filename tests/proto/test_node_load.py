"""NodeLoad, what a heartbeat carries: the measured prices survive the wire, and bad figures are refused."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixmesh.proto import radixmesh_pb2 as pb
from radixmesh.proto.metadata.codec import load_from_pb, load_to_pb
from radixmesh.proto.metadata.nodes import MAX_GROUP_CHARS, NodeLoad

peers = st.dictionaries(st.sampled_from(["a", "node-b", "c.1"]), st.floats(0, 1e3, allow_nan=False), max_size=3)


@settings(max_examples=60, deadline=None)
@given(
    counts=st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 2**53), st.integers(0, 2**53)),
    rate=st.floats(0, 1e6, allow_nan=False),
    gbps=peers,
    latency=peers,
    group=st.text("abc/-0123456789", max_size=40),
    disk=st.floats(0, 1e3, allow_nan=False),
    floor=st.floats(0, 10, allow_nan=False),
    share=st.floats(0, 1, allow_nan=False),
)
def test_load_survives_the_wire(counts: tuple[int, int, int], rate: float, gbps: dict[str, float],
                                latency: dict[str, float], group: str, disk: float, floor: float, share: float) -> None:
    load = NodeLoad(*counts, rate, gbps, latency, group, disk, floor, share)
    wire = load_to_pb(load).SerializeToString()
    assert load_from_pb(pb.NodeLoad.FromString(wire)) == load


@pytest.mark.parametrize("bad", [
    {"pull_latency_s": {"a": math.nan}},
    {"pull_latency_s": {"a": -0.1}},
    {"pull_latency_s": {"bad id": 0.01}},
    {"pull_latency_s": {f"n{i}": 0.01 for i in range(1025)}},
    {"compute_group": "x" * (MAX_GROUP_CHARS + 1)},
    {"step_floor_s": -0.001},
    {"step_floor_s": math.inf},
    {"compute_share": 1.5},
    {"compute_share": -0.5},
    {"compute_share": math.nan},
])
def test_bad_prices_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        NodeLoad(**bad)  # type: ignore[arg-type]


def test_a_load_without_the_new_fields_reads_as_unmeasured() -> None:
    """An agent of the previous version heartbeats no fixed cost and no group: nothing measured, shares nothing."""
    old = pb.NodeLoad(queued_requests=1, pull_gbps={"a": 1.0})
    assert load_from_pb(old) == NodeLoad(queued_requests=1, pull_gbps={"a": 1.0})
