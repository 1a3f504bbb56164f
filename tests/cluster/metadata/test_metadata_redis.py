"""The metadata service on a real redis-server: a new service on the same store answers at once."""

import asyncio
import json
from dataclasses import asdict

import pytest

from radixmesh.cluster.metadata.membership import StaleEpoch
from radixmesh.cluster.metadata.service import MetadataService
from radixmesh.cluster.metadata.service_config import ServiceConfig
from radixmesh.cluster.metadata.store import RedisStore, open_store
from radixmesh.common.metadata.client import MetadataClient
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.events import BlockStored, Tier
from radixmesh.proto.ids import NodeId
from radixmesh.proto.metadata.hits import RequestHits
from radixmesh.proto.metadata.messages import (
    ClusterStats,
    EventBatch,
    MatchQuery,
    MatchResult,
    NodeSnapshot,
    PublishStatus,
)
from radixmesh.proto.metadata.nodes import NodeInfo, NodeLoad
from radixmesh.proto.serve.tokens import TokenSources
from tests.support.servers import free_port, start_metadata_server

pytestmark = pytest.mark.integration

L = "layout-r"
H = [BlockHash(bytes([i]) * 16) for i in range(1, 17)]
A, B = NodeId("a"), NodeId("b")
TTL = 10.0
BB = 8192


class Clock:
    def __init__(self) -> None:
        self.now = 5000.0

    def __call__(self) -> float:
        return self.now


def service_on(url: str, clock: Clock) -> MetadataService:
    return MetadataService(RedisStore(url), ServiceConfig(lease_ttl_s=TTL), clock)


async def populate(client: MetadataClient) -> None:
    for n in (A, B):
        await client.register(NodeInfo(n, 3, L, 16, BB, f"addr-{n}", 100))
    await client.publish([EventBatch(A, 3, 1, (BlockStored(tuple(H[:4]), None, Tier.GPU),))])
    await client.publish([EventBatch(B, 3, 1, (BlockStored(tuple(H[:2]), None, Tier.HOST),))])
    await client.match([MatchQuery(L, tuple(H[:4]), tenant="t1", request_id="q")])
    await client.heartbeat(A, 3, NodeLoad(queued_requests=2), [RequestHits("q", "t1", TokenSources(48, 0, 0, 32))])


async def snapshot_of(client: MetadataClient) -> tuple[list[MatchResult], ClusterStats]:
    return (await client.match([MatchQuery(L, tuple(H[:6]))]), await client.stats())


def test_restart_serves_match_and_counters_before_any_resync(redis_url: str) -> None:
    async def body() -> None:
        clock = Clock()
        first, port = await start_metadata_server(service_on(redis_url, clock))
        async with MetadataClient(f"127.0.0.1:{port}") as client:
            await populate(client)
            before = await snapshot_of(client)
        await first.stop(None)  # graceful: persists the index

        second, port = await start_metadata_server(service_on(redis_url, clock))
        try:
            async with MetadataClient(f"127.0.0.1:{port}") as client:
                after = await snapshot_of(client)  # no node has sent anything to this service yet
                assert after == before
                res = before[0]
                assert res[0].cluster_blocks == 4 and res[0].nodes[0].load.queued_requests == 2
                stats = after[1]
                assert stats.hits.per_tenant["t1"].regret_tokens == 16
                assert stats.state_store == redis_url.rsplit("/", 1)[0] + "/0"
                # The sequence survived with the index: the node simply continues.
                ack = await client.publish([EventBatch(A, 3, 2, (BlockStored((H[4],), H[3], Tier.GPU),))])
                assert (ack.status, ack.next_seq) == (PublishStatus.OK, 3)
                second.service.check_invariants()
        finally:
            await second.stop(None)

    asyncio.run(body())


def test_events_after_last_persist_resync_after_restart(redis_url: str) -> None:
    clock = Clock()
    first = service_on(redis_url, clock)
    first.register(NodeInfo(A, 1, L, 16, BB, "x", 10))
    first.publish(EventBatch(A, 1, 1, (BlockStored(tuple(H[:2]), None, Tier.GPU),)))
    first.tick()  # periodic persist
    first.publish(EventBatch(A, 1, 2, (BlockStored((H[2],), H[1], Tier.GPU),)))
    first.store.close()  # a crash: the last event never reached the store

    second = service_on(redis_url, clock)
    assert second.match([MatchQuery(L, tuple(H[:3]))])[0].cluster_blocks == 2
    ack = second.publish(EventBatch(A, 1, 3, (BlockStored((H[3],), H[2], Tier.GPU),)))
    assert (ack.status, ack.next_seq) == (PublishStatus.RESYNC, 2)
    ack = second.sync_snapshot(NodeSnapshot(A, 1, 3, (BlockStored(tuple(H[:4]), None, Tier.GPU),)))
    assert ack.status is PublishStatus.OK
    assert second.match([MatchQuery(L, tuple(H[:4]))])[0].cluster_blocks == 4
    second.check_invariants()
    second.close()


def test_epoch_fence_and_lease_end_survive_restart(redis_url: str) -> None:
    clock = Clock()
    first = service_on(redis_url, clock)
    first.register(NodeInfo(A, 7, L, 16, BB, "x", 10))
    first.publish(EventBatch(A, 7, 1, (BlockStored(tuple(H[:2]), None, Tier.GPU),)))
    first.close()

    clock.now += TTL  # the lease ends while the service is down
    second = service_on(redis_url, clock)
    assert second.match([MatchQuery(L, tuple(H[:2]))])[0].nodes == ()
    assert second.stats().live_nodes == 0
    with pytest.raises(StaleEpoch):
        second.register(NodeInfo(A, 6, L, 16, BB, "x", 10))
    assert second.register(NodeInfo(A, 8, L, 16, BB, "x", 10)).snapshot_required
    second.check_invariants()
    second.close()


def test_lease_record_without_block_bytes_keeps_only_the_epoch_fence(redis_url: str) -> None:
    clock = Clock()
    old_info = {"node_id": A, "epoch": 4, "layout": L, "block_size": 16, "transfer_address": "x",
                "capacity_blocks": 10}
    record = {"epoch": 4, "info": old_info, "deadline": clock.now + TTL, "load": asdict(NodeLoad())}
    store = RedisStore(redis_url)
    store.save_node(A, json.dumps(record).encode())  # as written before NodeInfo had block_bytes
    store.close()

    service = service_on(redis_url, clock)
    assert service.membership.get(A) is None and service.stats().live_nodes == 0
    with pytest.raises(StaleEpoch):
        service.register(NodeInfo(A, 3, L, 16, BB, "x", 10))
    assert service.register(NodeInfo(A, 4, L, 16, BB, "x", 10)).snapshot_required
    service.check_invariants()
    service.close()


def test_redis_store_round_trip(redis_url: str) -> None:
    store = open_store(redis_url)
    store.save_node("n", b"rec")
    store.add_counters({"total": {"requests": 2, "prompt_tokens": 5}})
    store.add_counters({"total": {"requests": 1}, "node:n": {"requests": 1}})
    store.update_index({"": b"\x00blob"}, replace=True)
    again = RedisStore(redis_url)
    assert again.load_nodes() == {} and store.pending() == 4  # write-behind: nothing written yet
    store.close()  # writes what is pending
    assert again.load_nodes() == {"n": b"rec"}
    assert again.load_counters() == {"total": {"requests": 3, "prompt_tokens": 5}, "node:n": {"requests": 1}}
    assert again.load_index() == b"\x00blob"
    again.close()


def test_unreachable_redis_is_a_clear_error() -> None:
    with pytest.raises(Exception, match="(?i)connect"):
        RedisStore(f"redis://127.0.0.1:{free_port()}/0", socket_timeout_s=1.0)
    with pytest.raises(ValueError, match="memory"):
        open_store("postgres://x")
