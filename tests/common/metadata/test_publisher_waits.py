"""An idle node's publish loop waits until the node says events may have come, instead of asking it
every interval (issue 36: idle agents cheap); what comes is still sent by the next round, and the
loop never waits while something is left to send."""

import grpc
import pytest

from radixmesh.common.metadata.publisher import EventPublisher, PublisherConfig
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.events import BlockStored, Tier
from tests.support.poll import until
from tests.support.published_node import Node, Service

pytestmark = pytest.mark.anyio
FAST = PublisherConfig(publish_interval_s=0.001, heartbeat_interval_s=3600.0, max_backoff_s=0.002)
"""Rounds as fast as the loop turns; one heartbeat, at start."""


def stored(i: int) -> BlockStored:
    return BlockStored((BlockHash(bytes([i]) * 16),), None, Tier.GPU)


async def test_an_idle_loop_waits_for_the_node_then_sends_what_came() -> None:
    node, service = Node(), Service()
    p = EventPublisher(node, service, FAST)  # type: ignore[arg-type]
    await p.start()
    try:
        await until(lambda: node.waits == 1, "the first round to find nothing and wait", pause_s=0)
        assert node.takes == 1  # waiting, the loop asks the node nothing
        node.events = [stored(1)]
        node.stirred.set()  # as an engine job that ended
        await until(lambda: node.waits == 2, "the next round to send and wait again", pause_s=0)
        assert node.takes == 2 and [b.events for b in service.published] == [(stored(1),)]
    finally:
        await p.stop()


async def test_the_loop_does_not_wait_while_its_batches_are_refused() -> None:
    node, service = Node(), Service()
    service.failing = grpc.StatusCode.UNAVAILABLE
    node.events = [stored(1)]
    p = EventPublisher(node, service, FAST)  # type: ignore[arg-type]
    await p.start()
    try:
        await until(lambda: node.takes >= 3, "rounds that retry without the node stirring", pause_s=0)
        assert node.waits == 0 and service.published == []
        service.failing = None
        await until(lambda: node.waits == 1, "a round to send the batch, then wait", pause_s=0)
        assert [b.events for b in service.published] == [(stored(1),)]
    finally:
        await p.stop()


async def test_what_a_heartbeat_leaves_goes_out_though_the_node_stays_quiet() -> None:
    """A standby that took over expects an earlier batch than the next (the heartbeat's lease says
    so): the snapshot that repairs it leaves within a heartbeat interval, with no event to wake on."""
    node, service = Node(), Service()  # its leases expect batch 1 even once batch 1 was acknowledged
    node.events = [stored(1)]
    p = EventPublisher(node, service, PublisherConfig(publish_interval_s=0.001, heartbeat_interval_s=0.05))  # type: ignore[arg-type]
    await p.start()
    try:
        await until(lambda: service.snapshots >= 1, "the publish loop to send the snapshot the heartbeat owes",
                    pause_s=0.01)
        assert len(service.published) == 1 and not node.stirred.is_set()
    finally:
        await p.stop()
