"""Kill the active metadata service (SIGKILL) while clients send requests through a router: the
standby serves within 2 s of the kill, no request fails, and the router's index replica never lists
a block its node no longer holds for longer than one lease of the leader key."""

import asyncio

import pytest

from tests.support.failover_cluster import LEADER_TTL_S, run_failover

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_killing_the_active_metadata_service_under_load_fails_no_request() -> None:
    result = asyncio.run(run_failover())
    assert result.takeover_s < 2.0, f"the standby answered {result.takeover_s:.2f} s after the kill"
    assert result.failed == 0, result.errors[:3]
    assert result.requests > 20, "too little load to show anything"
    assert result.replica_snapshots >= 2, "the replica never resynced from the standby"
    assert result.stale_max_s < LEADER_TTL_S, f"replica listed an evicted block for {result.stale_max_s:.2f} s"
