"""An idle agent is cheap (issue 36): with no cache event waiting, a publish round puts no job on the
engine thread and the publisher may wait; an engine job and the disk writer each stir it, and what
they made is drained and published by the next round."""

import asyncio
import threading
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from radixmesh.cluster.metadata.server import MetadataServer
from radixmesh.common.metadata.client import MetadataClient
from radixmesh.common.metadata.publisher import EventPublisher, PublisherConfig
from radixmesh.node_agent.agent import NodeAgent
from radixmesh.node_agent.memory.disk.record import DiskBlock
from radixmesh.node_agent.memory.disk.tier import DiskTier
from radixmesh.proto.block_hash import BlockHash, hash_blocks
from radixmesh.proto.events import BlockStored, Tier
from radixmesh.proto.ids import NodeId
from radixmesh.proto.metadata.messages import MatchQuery
from tests.support.agents import agent_config, collect, plan, prompt
from tests.support.poll import until
from tests.support.servers import start_metadata_server
from tests.support.tiny_model import BS

pytestmark = pytest.mark.anyio
FULL = 3
"""Full blocks of the prompt served (plus a 2-token tail)."""


class Jobs:
    """Counts the jobs put on an agent's engine threads (EngineRunner.call and call_short)."""

    def __init__(self, agent: NodeAgent, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        for name in ("call", "call_short"):
            original = getattr(agent.runner, name)

            async def counted(*args: Any, _original: Any = original, **kw: Any) -> Any:
                self.count += 1
                return await _original(*args, **kw)

            monkeypatch.setattr(agent.runner, name, counted)


class Metadata(NamedTuple):
    server: MetadataServer
    address: str


@pytest.fixture
async def metadata() -> AsyncIterator[Metadata]:
    server, port = await start_metadata_server()
    yield Metadata(server, f"127.0.0.1:{port}")
    await server.stop(0)


async def published(metadata: Metadata, **kw: object) -> tuple[NodeAgent, EventPublisher]:
    """A started agent, registered, whose publisher the test drives (its loops never started)."""
    agent = NodeAgent(agent_config("a", **kw))
    await agent.start()
    # Installed as the agent's own: an agent without a publisher drains its events as a request ends.
    agent.publisher = EventPublisher(agent, MetadataClient(metadata.address, timeout_s=5.0), PublisherConfig())
    await agent.publisher.flush()
    return agent, agent.publisher


async def test_an_idle_publish_round_makes_no_engine_job(metadata: Metadata,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    agent, publisher = await published(metadata)
    try:
        jobs = Jobs(agent, monkeypatch)
        for _ in range(3):
            await publisher.flush()
        assert jobs.count == 0 and publisher.registrations == 1
    finally:
        await agent.stop()


async def test_a_request_stirs_the_agent_and_the_next_round_publishes_its_blocks(
        metadata: Metadata, monkeypatch: pytest.MonkeyPatch) -> None:
    agent, publisher = await published(metadata)
    tokens = prompt(5, FULL * BS + 2)
    try:
        assert await agent.take_events() == []
        waiting = asyncio.create_task(agent.wait_for_events())
        await asyncio.sleep(0)  # one turn: the task starts waiting
        assert not waiting.done()
        await collect(agent.serve(plan("q", tokens)))
        await waiting  # the request's engine jobs stirred it
        jobs = Jobs(agent, monkeypatch)
        await publisher.flush()
        assert jobs.count == 1  # the drain
        client = MetadataClient(metadata.address, timeout_s=5.0)
        [result] = await client.match([MatchQuery(agent.layout.fingerprint(), tuple(hash_blocks(tokens, BS)))])
        await client.close()
        assert [(n.node_id, n.gpu_blocks) for n in result.nodes] == [(NodeId("a"), FULL)]
    finally:
        await agent.stop()


async def test_the_disk_writer_stirs_the_agent_and_its_events_are_drained(
        metadata: Metadata, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The disk writer adds events on its own thread, after the engine job that offered the blocks
    has ended: until it has written them the agent stays stirred, then drains what it wrote."""
    agent, _ = await published(metadata, disk_cache=str(tmp_path), disk_cache_bytes=1 << 28)
    disk = agent.memory.disk
    assert isinstance(disk, DiskTier)
    go = threading.Event()
    append = disk.store.append

    def held_append(batch: Sequence[DiskBlock]) -> list[DiskBlock]:
        go.wait()  # the writer holds the block until the test lets it go
        return append(batch)

    monkeypatch.setattr(disk.store, "append", held_append)
    block = BlockHash(bytes(range(16)))
    try:
        assert await agent.take_events() == []
        disk.offer(block, bytes(agent.layout.block_bytes), parent=None)  # as the host tier's eviction does
        assert await agent.take_events() == []  # queued, not written: no event yet
        waiting = asyncio.create_task(agent.wait_for_events())
        await until(waiting.done, "the agent to say events may come while the disk writes", pause_s=0)
        go.set()
        agent.memory.flush_disk()
        jobs = Jobs(agent, monkeypatch)
        assert await agent.take_events() == [BlockStored((block,), None, Tier.DISK)]
        assert jobs.count == 1  # the drain
        assert await agent.take_events() == []
        waiting = asyncio.create_task(agent.wait_for_events())
        await asyncio.sleep(0)
        assert not waiting.done()  # written and drained: nothing more can come without a job
        waiting.cancel()
    finally:
        go.set()
        await agent.stop()
