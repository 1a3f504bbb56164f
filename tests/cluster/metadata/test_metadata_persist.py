"""Persisting the index (issue 28, finding 8): nothing with the memory store; with Redis only the
nodes changed since the last persist, encoded off the event loop, and a new service restores it."""

import asyncio
import threading

import pytest
import redis

from radixmesh.cluster.metadata import service as service_module
from radixmesh.cluster.metadata.index import GlobalIndex
from radixmesh.cluster.metadata.service import MetadataService
from radixmesh.cluster.metadata.service_config import ServiceConfig
from radixmesh.cluster.metadata.store import MemoryStore, RedisStore
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.events import AllCleared, BlockRemoved, BlockStored, Tier
from radixmesh.proto.ids import NodeId
from radixmesh.proto.metadata.codec import decode_stored_index, encode_stored_index
from radixmesh.proto.metadata.messages import EventBatch, NodeSnapshot
from radixmesh.proto.metadata.nodes import NodeInfo

L = "layout-persist"
NODES = [NodeId(f"n{i}") for i in range(20)]
BLOCKS = 50


class Clock:
    def __init__(self) -> None:
        self.now = 5000.0

    def __call__(self) -> float:
        return self.now


def h(node: int, i: int) -> BlockHash:
    return BlockHash(bytes([node]) + i.to_bytes(15, "big"))


def filled(store: MemoryStore | RedisStore, clock: Clock) -> MetadataService:
    """20 nodes of 50 blocks each (two chains, one on host too)."""
    s = MetadataService(store, ServiceConfig(lease_ttl_s=60.0), clock)
    for n, node in enumerate(NODES):
        s.register(NodeInfo(node, 1, L, 16, 4096, "x", BLOCKS))
        s.publish(EventBatch(node, 1, 1, (
            BlockStored(tuple(h(n, i) for i in range(30)), None, Tier.GPU),
            BlockStored(tuple(h(n, i) for i in range(30, BLOCKS)), h(n, 29), Tier.GPU),
            BlockStored(tuple(h(n, i) for i in range(10)), None, Tier.HOST),
        )))
    return s


class Encodings:
    """Counts calls of the service's index encoder and the threads they ran on."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.threads: list[threading.Thread] = []
        monkeypatch.setattr(service_module, "encode_stored_index", self._encode)

    def _encode(self, snapshots: list[NodeSnapshot]) -> bytes:
        self.threads.append(threading.current_thread())
        return encode_stored_index(snapshots)


def test_persist_with_the_memory_store_serialises_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    encodings = Encodings(monkeypatch)
    chains = []
    monkeypatch.setattr(service_module.GlobalIndex, "node_chains", lambda self, node: chains.append(node))
    store = MemoryStore()
    s = filled(store, Clock())
    s.persist()
    s.tick()
    s.close()
    assert encodings.threads == [] and chains == [] and store.load_index() is None


@pytest.mark.integration
def test_a_persist_after_a_small_change_writes_that_change_only(redis_url: str) -> None:
    sent = redis.Redis.from_url(redis_url)

    def bytes_sent() -> int:
        return int(sent.info("stats")["total_net_input_bytes"])

    async def body() -> None:
        clock = Clock()
        store = RedisStore(redis_url)
        s = filled(store, clock)
        s.persist()
        start = bytes_sent()
        await store.flush()
        full = bytes_sent() - start
        s.publish(EventBatch(NODES[3], 1, 2, (BlockRemoved((h(3, 49),), Tier.GPU),)))
        s.persist()
        assert store.pending() == 1  # one node's part
        start = bytes_sent()
        await store.flush()
        small = bytes_sent() - start
        assert small < 2 * full / len(NODES), (small, full)
        s.persist()  # nothing changed since
        assert store.pending() == 0
        store.close()

    asyncio.run(body())
    sent.close()


@pytest.mark.integration
def test_the_index_is_encoded_off_the_event_loop(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    encodings = Encodings(monkeypatch)

    async def body() -> None:
        store = RedisStore(redis_url)
        s = filled(store, Clock())
        s.persist()
        assert encodings.threads == []  # persist only recorded what to encode
        await store.flush()
        assert len(encodings.threads) == len(NODES)
        assert threading.main_thread() not in encodings.threads
        store.close()

    asyncio.run(body())


@pytest.mark.integration
def test_incremental_persists_restore_the_same_index(redis_url: str) -> None:
    clock = Clock()
    seed = RedisStore(redis_url)
    ghost = NodeSnapshot(NodeId("ghost"), 1, 3, (BlockStored((h(99, 0),), None, Tier.GPU),))
    seed.update_index({"ghost": encode_stored_index([ghost])})  # a part no live node owns
    seed.close()

    async def body() -> MetadataService:
        store = RedisStore(redis_url)
        s = filled(store, clock)
        s.persist()  # the first: every live node's part, and no other
        await store.flush()
        s.publish(EventBatch(NODES[0], 1, 2, (BlockStored((h(0, 60),), h(0, 49), Tier.HOST),)))
        s.sync_snapshot(NodeSnapshot(NODES[1], 1, 7, (BlockStored((h(1, 70), h(1, 71)), None, Tier.GPU),)))
        clock.now += 30
        for node in NODES[3:]:
            s.heartbeat(node, 1, s.membership.get(node).load)  # type: ignore[union-attr]
        clock.now += 31  # nodes 0-2 leave; 0 and 1 changed first
        s.tick()
        s.register(NodeInfo(NODES[2], 2, L, 16, 4096, "x", BLOCKS))  # back, as a new incarnation
        s.publish(EventBatch(NODES[2], 2, 1, (BlockStored((h(2, 80),), None, Tier.GPU),)))
        s.persist()
        await store.flush()
        store.close()
        return s

    before = asyncio.run(body())
    stored = RedisStore(redis_url)
    parts = {snap.node_id for snap in decode_stored_index(stored.load_index() or b"")}
    assert parts == {NodeId(f"n{i}") for i in range(2, 20)}  # no ghost, nor the nodes that left
    after = MetadataService(stored, ServiceConfig(lease_ttl_s=60.0), clock)
    for node in NODES[2:]:
        assert (sorted(map(repr, after.index.node_chains(node))), after.membership.get(node).last_seq) == (  # type: ignore[union-attr]
            sorted(map(repr, before.index.node_chains(node))), before.membership.get(node).last_seq)  # type: ignore[union-attr]
    assert len(after.index) == len(before.index) == 18 * BLOCKS - 49
    after.check_invariants()
    stored.close()


@pytest.mark.parametrize("frozen", [[NODES[0]], NODES[:3]], ids=["one node's copy", "the partition's copy"])
def test_frozen_chains_are_the_blocks_as_of_the_call(frozen: list[NodeId]) -> None:
    index = GlobalIndex()
    for n, node in enumerate(NODES[:3]):
        index.add_node(node, L)
        # Node 0 holds under a quarter of the partition: its copy is its own.
        index.apply(node, [BlockStored(tuple(h(n, i) for i in range(8 if n == 0 else 40)), None, Tier.GPU),
                           BlockStored((h(n, 0), h(n, 1)), None, Tier.HOST),
                           BlockStored((h(0, 0),), None, Tier.HOST)])
    before = {node: index.node_chains(node) for node in frozen}
    chains = index.frozen_chains(frozen)
    for node in NODES[:3]:  # every change the index can make, before the copies are read
        index.apply(node, [BlockRemoved((h(0, 0), h(1, 5)), Tier.GPU), BlockStored((h(9, 9),), None, Tier.HOST)])
    index.apply(NODES[0], [AllCleared()])
    index.drop_node(NODES[1])
    assert {node: chains[node]() for node in frozen} == before
