"""Per-request lists stay bounded when nothing takes them (issue 28, finding 10): a standalone
agent's hit reports, the publisher's during a metadata outage, and a stale publisher's node, which
it keeps draining. What is dropped (the oldest first) is counted and exported."""

from collections.abc import Sequence

import grpc
import pytest

from radixmesh.common.metadata.publisher import EventPublisher, PendingHits, PublisherConfig
from radixmesh.node_agent import agent as agent_module
from radixmesh.node_agent.agent import NodeAgent
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.events import BlockStored, CacheEvent, Tier
from radixmesh.proto.ids import NodeId
from radixmesh.proto.metadata.hits import RequestHits
from radixmesh.proto.metadata.messages import EventBatch, NodeSnapshot, PublishAck, PublishStatus
from radixmesh.proto.metadata.nodes import Lease, NodeInfo, NodeLoad
from radixmesh.proto.serve.tokens import TokenSources
from tests.support.agents import agent_config, collect, plan, prompt

pytestmark = pytest.mark.anyio
A = NodeId("a")


def hits(*ids: str) -> list[RequestHits]:
    return [RequestHits(i, "t", TokenSources(computed=4)) for i in ids]


async def test_a_standalone_agent_keeps_at_most_the_bound_and_counts_the_rest(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agent_module, "MAX_HITS_PER_HEARTBEAT", 3)
    agent = NodeAgent(agent_config("a"))  # no metadata service: nothing ever takes its hits
    await agent.start()
    try:
        for i in range(5):
            await collect(agent.serve(plan(f"q{i}", prompt(i, 9), max_tokens=1)))
        text = await agent.prometheus_text()
        [dropped] = [line for line in text.splitlines() if line.startswith("radixmesh_hit_reports_dropped_total{")]
        assert 'node="a"' in dropped and dropped.endswith(" 2.0")
        assert [h.request_id for h in agent.take_hits()] == ["q2", "q3", "q4"]
    finally:
        await agent.stop()


def test_pending_hits_drop_the_oldest_first() -> None:
    pending = PendingHits(3)
    pending.add(hits("a", "b"))
    pending.add(hits("c", "d", "e"))
    assert [h.request_id for h in pending.first(2)] == ["c", "d"] and (len(pending), pending.dropped) == (3, 2)
    pending.remove_first(2)
    assert [h.request_id for h in pending.take()] == ["e"] and len(pending) == 0
    with pytest.raises(ValueError, match="limit"):
        PendingHits(0)


class Node:
    """A PublishedNode whose lists grow until the publisher takes them."""

    def __init__(self) -> None:
        self.events: list[CacheEvent] = []
        self.hits: list[RequestHits] = []

    def node_info(self) -> NodeInfo:
        return NodeInfo(A, 1, "L", 16, 4096, "x", 100)

    async def take_events(self) -> list[CacheEvent]:
        events, self.events = self.events, []
        return events

    async def snapshot(self) -> tuple[BlockStored, ...]:
        self.events = []
        return ()

    async def load(self) -> NodeLoad:
        return NodeLoad()

    def take_hits(self) -> list[RequestHits]:
        taken, self.hits = self.hits, []
        return taken

    async def recall(self, hashes: Sequence[BlockHash]) -> None:
        pass

    def next_epoch(self) -> int:
        return 2


class Service:
    """A MetadataClient stand-in: every call fails with `failing` (None: answers), heartbeats kept."""

    def __init__(self) -> None:
        self.failing: grpc.StatusCode | None = None
        self.beats: list[list[str]] = []

    def _check(self) -> None:
        if self.failing is not None:
            raise grpc.aio.AioRpcError(self.failing, details="refused by the test")

    async def register(self, info: NodeInfo) -> Lease:
        self._check()
        return Lease(A, 1, 10.0, 1, snapshot_required=False)

    async def heartbeat(self, node: NodeId, epoch: int, load: NodeLoad, hits: Sequence[RequestHits]) -> Lease:
        self._check()
        self.beats.append([h.request_id for h in hits])
        return Lease(A, 1, 10.0, 1, snapshot_required=False)

    async def publish(self, batches: Sequence[EventBatch]) -> PublishAck:
        self._check()
        return PublishAck(PublishStatus.OK, batches[-1].seq + 1)

    async def sync_snapshot(self, snapshot: NodeSnapshot) -> PublishAck:
        self._check()
        return PublishAck(PublishStatus.OK, snapshot.seq + 1)

    async def close(self) -> None:
        pass


def publisher(node: Node, service: Service, max_pending_hits: int = 4) -> EventPublisher:
    return EventPublisher(node, service, PublisherConfig(max_pending_hits=max_pending_hits))  # type: ignore[arg-type]


async def test_during_a_metadata_outage_the_publisher_keeps_the_newest_hits_only() -> None:
    node, service = Node(), Service()
    p = publisher(node, service)
    service.failing = grpc.StatusCode.UNAVAILABLE
    for beat in range(3):
        node.hits = hits(*(f"q{beat}.{i}" for i in range(3)))
        await p.heartbeat()
    assert p.hits_dropped == 5 and node.hits == []
    service.failing = None
    await p.heartbeat()
    assert service.beats == [["q1.2", "q2.0", "q2.1", "q2.2"]]


async def test_a_stale_publisher_drains_its_node_and_counts_the_hits() -> None:
    node, service = Node(), Service()
    p = publisher(node, service)
    service.failing = grpc.StatusCode.FAILED_PRECONDITION  # a newer incarnation of the node exists
    await p.heartbeat()
    assert p.stale
    for round_ in range(3):
        node.events = [BlockStored((BlockHash(bytes([round_]) * 16),), None, Tier.GPU)]
        node.hits = hits(f"q{round_}")
        await p.flush()
        await p.heartbeat()
        assert (node.events, node.hits) == ([], [])
    assert p.hits_dropped == 3 and service.beats == []
