"""Per-request lists stay bounded when nothing takes them (issue 28, finding 10): a standalone
agent's hit reports, the publisher's during a metadata outage, and a stale publisher's node, which
it keeps draining. What is dropped (the oldest first) is counted and exported."""

import grpc
import pytest

from radixmesh.common.metadata.publisher import EventPublisher, PendingHits, PublisherConfig
from radixmesh.node_agent import agent as agent_module
from radixmesh.node_agent.agent import NodeAgent
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.events import BlockStored, Tier
from radixmesh.proto.metadata.hits import RequestHits
from radixmesh.proto.serve.tokens import TokenSources
from tests.support.agents import agent_config, collect, plan, prompt
from tests.support.published_node import Node, Service

pytestmark = pytest.mark.anyio


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
