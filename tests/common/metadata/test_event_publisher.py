"""EventPublisher against a real in-process metadata gRPC server on 127.0.0.1: registration, batched
events, RESYNC and re-registration with snapshots, heartbeats with load and realized hits."""

import logging
import random
import time
from collections.abc import AsyncIterator

import pytest

from radixmesh.cluster.fleet.ingest.external_engine import ExternalEngineConfig, ExternalEngineNode
from radixmesh.cluster.fleet.ingest.subscriber import SubscriberConfig
from radixmesh.cluster.metadata.server import MetadataServer
from radixmesh.cluster.metadata.service import MetadataService
from radixmesh.cluster.metadata.service_config import ServiceConfig
from radixmesh.cluster.metadata.store import MemoryStore
from radixmesh.common.metadata.client import MetadataClient
from radixmesh.common.metadata.publisher import EventPublisher, PublisherConfig
from radixmesh.node_agent.agent import NodeAgent
from radixmesh.proto.block_hash import BlockHash, hash_blocks
from radixmesh.proto.events import BlockStored, CacheEvent, Tier, chains
from radixmesh.proto.ids import NodeId
from radixmesh.proto.metadata.messages import MatchQuery
from tests.support.agents import agent_config, collect, plan, prompt
from tests.support.poll import until
from tests.support.servers import start_metadata_server
from tests.support.tiny_model import BS

pytestmark = [pytest.mark.anyio, pytest.mark.integration]
QUIET = 3600.0  # the background loops run one round at start, then stay out of the test's way


class Clock:
    def __init__(self) -> None:
        # Starts at wall time: agents' epochs are wall-time microseconds, and the service refuses
        # epochs ahead of its clock.
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


class Metadata:
    def __init__(self, server: MetadataServer, port: int, clock: Clock) -> None:
        self.server, self.clock = server, clock
        self.address = f"127.0.0.1:{port}"
        self.service = server.service
        self.client = MetadataClient(self.address, timeout_s=5.0)
        self.port = port

    async def restart(self, store: MemoryStore) -> None:
        """Stop the service and start a new one from `store` on the same port."""
        await self.server.stop(0)
        self.service = MetadataService(store, ServiceConfig(lease_ttl_s=10.0), clock=self.clock)
        self.server, _ = await start_metadata_server(self.service, port=self.port)


@pytest.fixture
async def metadata() -> AsyncIterator[Metadata]:
    clock = Clock()
    service = MetadataService(config=ServiceConfig(lease_ttl_s=10.0), clock=clock)
    server, port = await start_metadata_server(service)
    m = Metadata(server, port, clock)
    yield m
    await m.client.close()
    await m.server.stop(0)


async def new_agent(node: str, metadata: Metadata, epoch: int | None = None) -> NodeAgent:
    a = NodeAgent(agent_config(node, metadata_address=metadata.address, heartbeat_interval_s=QUIET,
                               publish_interval_s=QUIET), epoch=epoch)
    await a.start()
    return a


def publisher(agent: NodeAgent) -> EventPublisher:
    assert agent.publisher is not None
    return agent.publisher


async def held_blocks(metadata: Metadata, agent: NodeAgent, hashes: list[BlockHash]) -> int:
    [result] = await metadata.client.match([MatchQuery(agent.layout.fingerprint(), tuple(hashes))])
    return next((n.gpu_blocks for n in result.nodes if n.node_id == agent.node), 0)


def test_chains_group_runs_by_parent() -> None:
    h = [BlockHash(bytes([i]) * 16) for i in range(5)]
    pairs = [(h[0], None), (h[1], h[0]), (h[2], h[1]), (h[3], h[0]), (h[4], None)]
    assert chains(pairs, Tier.GPU) == [BlockStored((h[0], h[1], h[2]), None, Tier.GPU),
                                       BlockStored((h[3],), h[0], Tier.GPU),
                                       BlockStored((h[4],), None, Tier.GPU)]


async def test_registers_and_publishes_cached_prefixes(metadata: Metadata) -> None:
    agent = await new_agent("a", metadata)
    try:
        tokens = prompt(30, 22)
        await collect(agent.serve(plan("q", tokens)))
        await publisher(agent).flush()
        hashes = hash_blocks(tokens, BS)
        assert await held_blocks(metadata, agent, hashes) == 5
        member = metadata.service.membership.get(NodeId("a"))
        assert member is not None and member.info == agent.node_info()
        assert publisher(agent).registrations == 1
    finally:
        await agent.stop()


async def test_heartbeat_reports_load_and_realized_hits(metadata: Metadata) -> None:
    agent = await new_agent("a", metadata)
    try:
        tokens = prompt(31, 21)
        await collect(agent.serve(plan("q1", tokens)))
        await collect(agent.serve(plan("q2", tokens, tenant="t")))
        await collect(agent.serve(plan("q3", tokens)))
        await publisher(agent).heartbeat()
        total = (await metadata.client.stats()).hits.total
        assert (total.requests, total.prompt_tokens, total.local_gpu_tokens) == (3, 63, 20)
        member = metadata.service.membership.get(NodeId("a"))
        assert member is not None and member.load.prefill_tokens_per_s > 0
        await publisher(agent).heartbeat()  # hits are counted once
        assert (await metadata.client.stats()).hits.total.requests == 3
    finally:
        await agent.stop()


async def test_an_agent_keeps_a_block_the_cluster_lost_as_reused(metadata: Metadata) -> None:
    """The cluster's ghost end to end: "a" evicts the only copy of a prompt's blocks, "b"'s next
    lease lists them, and "b" stores them as re-used (S3-FIFO's main queue) where blocks it computes
    for the first time go to probation."""
    a, b = await new_agent("a", metadata), await new_agent("b", metadata)
    try:
        lost, fresh = prompt(40, 17), prompt(41, 17)
        lost_hashes, fresh_hashes = hash_blocks(lost, BS), hash_blocks(fresh, BS)
        await collect(a.serve(plan("q1", lost)))
        await a.runner.call(a.memory.evict, Tier.GPU)
        await publisher(a).flush()
        layout = a.layout.fingerprint()
        assert all(metadata.service.index.recalled(layout, h) for h in lost_hashes)
        await publisher(b).heartbeat()
        lease = publisher(b).lease
        assert lease is not None and set(lost_hashes) <= set(lease.recalled)
        await publisher(b).heartbeat()  # each loss is reported once
        assert publisher(b).lease.recalled == ()  # type: ignore[union-attr]
        await collect(b.serve(plan("q2", lost)))
        await collect(b.serve(plan("q3", fresh)))
        cache = b.memory.gpu.cache  # which S3-FIFO queue holds a block: the pool's own state, no door tells
        order = cache.pool._order
        assert all(order.main.is_stamped(cache._table[h]) for h in lost_hashes)  # type: ignore[attr-defined]
        assert not any(order.main.is_stamped(cache._table[h]) for h in fresh_hashes)  # type: ignore[attr-defined]
        await publisher(b).flush()
        assert not any(metadata.service.index.recalled(layout, h) for h in lost_hashes)  # held again
        metadata.service.index.check_invariants()
    finally:
        await a.stop()
        await b.stop()


async def test_service_restored_from_older_state_gets_a_snapshot(metadata: Metadata) -> None:
    agent = await new_agent("a", metadata)
    try:
        first, second, third = prompt(32, 17), prompt(33, 13), prompt(34, 9)
        await collect(agent.serve(plan("q1", first)))
        await publisher(agent).flush()
        metadata.service.persist()  # the store now holds the index up to batch 1
        saved = MemoryStore()
        for node, record in metadata.service.store.load_nodes().items():
            saved.save_node(node, record)
        saved.update_index({"": metadata.service.store.load_index() or b""}, replace=True)
        await collect(agent.serve(plan("q2", second)))
        await publisher(agent).flush()  # batch 2: applied, then lost with the service
        await metadata.restart(saved)
        before = publisher(agent).snapshots  # (a fresh registration is answered with one, too)
        await collect(agent.serve(plan("q3", third)))
        await publisher(agent).flush()  # batch 3 after 1: RESYNC, answered with a snapshot
        assert publisher(agent).snapshots == before + 1
        for tokens in (first, second, third):
            assert await held_blocks(metadata, agent, hash_blocks(tokens, BS)) == len(tokens) // BS
    finally:
        await agent.stop()


async def test_reregisters_with_a_snapshot_after_its_lease_ended(metadata: Metadata) -> None:
    agent = await new_agent("a", metadata)
    try:
        tokens = prompt(36, 17)
        await collect(agent.serve(plan("q", tokens)))
        await publisher(agent).flush()
        metadata.clock.now += 60  # the lease ends; the index drops the node
        assert await held_blocks(metadata, agent, hash_blocks(tokens, BS)) == 0
        first = agent.epoch
        await publisher(agent).heartbeat()  # NOT_FOUND: forget the lease, become a new incarnation
        await publisher(agent).heartbeat()  # register again, snapshot, beat
        assert publisher(agent).registrations == 2
        assert agent.epoch > first and publisher(agent).epoch == agent.epoch
        member = metadata.service.membership.get(agent.node)
        assert member is not None and member.info.epoch == agent.epoch  # the service knows the new one
        assert await held_blocks(metadata, agent, hash_blocks(tokens, BS)) == 4
    finally:
        await agent.stop()


async def test_an_external_engine_reregisters_after_its_lease_ended(metadata: Metadata) -> None:
    """ExternalEngineNode is a PublishedNode too: the service's NOT_FOUND makes it a new incarnation
    (it had no next_epoch, so that heartbeat raised AttributeError; mypy found it once it resolved
    the radixmesh imports)."""
    config = ExternalEngineConfig(NodeId("e"), "http://127.0.0.1:1", SubscriberConfig("tcp://127.0.0.1:1"), "l",
                                  "m", block_size=BS, capacity_blocks=8)
    node = ExternalEngineNode(config)
    pub = EventPublisher(node, MetadataClient(metadata.address, timeout_s=5.0), PublisherConfig())
    try:
        await pub.heartbeat()  # register, beat
        first = node.epoch
        metadata.clock.now += 60  # the lease ends
        await pub.heartbeat()  # NOT_FOUND: a new incarnation
        await pub.heartbeat()  # register again, beat
        assert pub.registrations == 2 and node.epoch > first and pub.epoch == node.epoch
        member = metadata.service.membership.get(NodeId("e"))
        assert member is not None and member.info.epoch == node.epoch
    finally:
        await pub.stop()


async def test_a_lease_expiry_is_a_warning_with_the_silence_and_the_ttl(
        metadata: Metadata, caplog: pytest.LogCaptureFixture) -> None:
    config = ExternalEngineConfig(NodeId("e"), "http://127.0.0.1:1", SubscriberConfig("tcp://127.0.0.1:1"), "l",
                                  "m", block_size=BS, capacity_blocks=8)
    node = ExternalEngineNode(config)
    beats = Clock()  # the publisher's own clock, apart from the service's
    pub = EventPublisher(node, MetadataClient(metadata.address, timeout_s=5.0), PublisherConfig(), clock=beats)
    try:
        await pub.heartbeat()  # register, beat: renewed now
        beats.now += 42.5  # the node stalls
        metadata.clock.now += 60  # past the 10 s lease
        with caplog.at_level(logging.WARNING, logger="radixmesh.common.metadata.publisher"):
            await pub.heartbeat()  # NOT_FOUND
        [record] = [r for r in caplog.records if "lease expired" in r.getMessage()]
        assert record.levelno == logging.WARNING
        assert record.getMessage().startswith("node e: its lease expired at the metadata service (last "
                                              "heartbeat renewed it 42.5 s ago, lease TTL 10 s)")
        assert pub.lease_expiries == 1
    finally:
        await pub.stop()


async def test_lease_expiries_are_counted_in_the_agents_metrics(metadata: Metadata) -> None:
    agent = await new_agent("a", metadata)
    try:
        assert 'radixmesh_lease_expiries_total{model_name="tiny-test",node="a"} 0.0' in await agent.prometheus_text()
        metadata.clock.now += 60  # the lease ends
        await publisher(agent).heartbeat()  # NOT_FOUND
        await publisher(agent).heartbeat()  # registered again
        assert 'radixmesh_lease_expiries_total{model_name="tiny-test",node="a"} 1.0' in await agent.prometheus_text()
    finally:
        await agent.stop()


async def test_older_incarnation_goes_stale(metadata: Metadata) -> None:
    old = await new_agent("a", metadata, epoch=5)
    new = await new_agent("a", metadata, epoch=6)
    try:
        await publisher(new).flush()
        await publisher(old).heartbeat()
        assert publisher(old).stale and not publisher(new).stale
        member = metadata.service.membership.get(NodeId("a"))
        assert member is not None and member.info.epoch == 6
    finally:
        await old.stop()
        await new.stop()


async def test_unreachable_service_does_not_stop_serving(metadata: Metadata) -> None:
    address = metadata.address
    await metadata.server.stop(0)
    agent = NodeAgent(agent_config("a", metadata_address=address, heartbeat_interval_s=QUIET,
                                   publish_interval_s=QUIET, ))
    await agent.start()
    try:
        _, result = await collect(agent.serve(plan("q", prompt(37, 14))))
        assert len(result.output_token_ids) == 6
        await publisher(agent).flush()
        await publisher(agent).heartbeat()
        assert publisher(agent).lease is None and publisher(agent).registrations == 0
        await agent.check_invariants()
    finally:
        await agent.stop()


async def test_the_publisher_backs_off_while_the_service_refuses(metadata: Metadata) -> None:
    agent = await new_agent("a", metadata)
    try:
        # Nothing listens at 127.0.0.1:1: every round fails, and each makes the next wait longer.
        refused = MetadataClient("127.0.0.1:1", timeout_s=1.0)
        p = EventPublisher(agent, refused, PublisherConfig(publish_interval_s=0.05, max_backoff_s=1.0),
                           rng=random.Random(0))
        assert p.next_delay(0.05) == 0.05
        delays = []
        for _ in range(6):
            await p.flush()
            delays.append(p.next_delay(0.05))
        assert p.failures == 6
        # Doubling with jitter in [1/2, 1] of the grown delay, capped at max_backoff_s.
        grown = [min(1.0, 0.05 * 2**n) for n in range(1, 7)]
        assert all(max(0.05, g / 2) <= d <= g for g, d in zip(grown, delays, strict=True)), delays
        assert delays[-1] <= 1.0
        await refused.close()
    finally:
        await agent.stop()


class FlakyNode:
    """The agent, except that its first `failures` event drains raise (a bug in the node)."""

    def __init__(self, agent: NodeAgent, failures: int) -> None:
        self._agent, self.failures = agent, failures

    async def take_events(self) -> list[CacheEvent]:
        if self.failures:
            self.failures -= 1
            raise RuntimeError("the node's event log is corrupt")
        return await self._agent.take_events()

    def __getattr__(self, name: str) -> object:
        return getattr(self._agent, name)


async def test_an_unexpected_error_is_counted_and_the_loops_go_on(metadata: Metadata) -> None:
    # The publisher under test is the node's only one. It is installed as the agent's publisher: an
    # agent without one drains its own events when a request finishes, before a flush could send them.
    # It flushes every 0.5 s, slower than the request: the request's events wait for a later round.
    agent = NodeAgent(agent_config("a"))
    await agent.start()
    assert agent.publisher is None
    try:
        p = EventPublisher(FlakyNode(agent, failures=2), MetadataClient(metadata.address, timeout_s=5.0),  # type: ignore[arg-type]
                           PublisherConfig(publish_interval_s=0.5, heartbeat_interval_s=0.01, max_backoff_s=0.05))
        agent.publisher = p
        await p.start()
        try:
            # Both drains failed, and the registration's snapshot is sent: a snapshot drains the
            # node's events, so one taken after the request below would leave no batch to send.
            await until(lambda: p.loop_errors >= 2 and p.snapshots > 0, "the node to fail twice and send its snapshot")
            # Events made after both failures: only a publish round that survived them sends them.
            await collect(agent.serve(plan("q", prompt(41, 14))))
            await until(lambda: p.batches > 0, "the publish loop to recover")
        finally:
            await p.stop()
            agent.publisher = None
        assert p.loop_errors == 2
        assert await held_blocks(metadata, agent, hash_blocks(prompt(41, 14), BS)) > 0
    finally:
        await agent.stop()
