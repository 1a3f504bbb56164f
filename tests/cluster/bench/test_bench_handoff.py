"""A bench cell's hand-off figures (the window's difference of the router's /stats counters), and
the split arms whose hand-off begins after the prefill (`_after`), to compare the streamed one with."""

import pytest

from radixmesh.cluster.bench.arms import LocalClusters, arm_named, is_arm
from radixmesh.cluster.bench.runner import handoff_delta
from radixmesh.cluster.launch.config import LauncherConfig


def test_the_window_counts_its_own_hand_offs_and_their_overlapped_share() -> None:
    before = {"handoffs": {"pulled": 2}, "handoff_bytes": 100, "handoff_seconds": 1.0, "handoff_overlap_seconds": 0.5}
    after = {"handoffs": {"pulled": 5, "recomputed": 1}, "handoff_bytes": 400, "handoff_seconds": 5.0,
             "handoff_overlap_seconds": 3.5}
    assert handoff_delta(before, after) == {"handoffs": {"pulled": 3, "recomputed": 1}, "bytes": 300,
                                            "seconds": 4.0, "overlap_seconds": 3.0, "overlap": 0.75}


def test_an_aggregated_arm_has_no_hand_off_and_no_share() -> None:
    empty = {"handoffs": {}, "handoff_bytes": 0, "handoff_seconds": 0.0, "handoff_overlap_seconds": 0.0}
    assert handoff_delta(empty, empty) == {"handoffs": {}, "bytes": 0, "seconds": 0.0, "overlap_seconds": 0.0,
                                           "overlap": None}


def test_a_split_arm_after_the_prefill_is_the_same_split_not_streamed() -> None:
    after = arm_named("split_06p_after")
    assert (after.name, after.split, after.stream) == ("split_6p_after", "6p", False)
    assert arm_named("split_half").stream and not arm_named("split_half_after").stream
    assert is_arm("split_half_after") and not is_arm("cost_after") and not is_arm("split_half_after_after")
    with pytest.raises(ValueError, match="only a split arm"):
        arm_named("cost_after")
    base = LauncherConfig(local_nodes=4)
    assert LocalClusters(base).config(arm_named("split_half_after")).stream_handoff is False
    assert LocalClusters(base).config(arm_named("split_half")).stream_handoff is True
