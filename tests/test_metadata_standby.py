"""A standby metadata service on the same Redis takes over when the active one dies: within 2 s,
with the nodes' leases and the index restored, and clients listing both addresses fail over."""

import asyncio
import time

import grpc
import pytest
from local_servers import free_port

from radixmesh.cluster.launch.config import LauncherConfig
from radixmesh.cluster.metadata.leader import LeaderLease, serve_while_leader
from radixmesh.cluster.metadata.server import MetadataServer, ServerOptions, create_server
from radixmesh.cluster.metadata.service import MetadataService, ServiceConfig
from radixmesh.cluster.metadata.store import RedisStore
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.events import BlockStored, Tier
from radixmesh.proto.ids import NodeId
from radixmesh.proto.metadata.client import MetadataClient
from radixmesh.proto.metadata.messages import EventBatch, MatchQuery
from radixmesh.proto.metadata.nodes import NodeInfo, NodeLoad

pytestmark = pytest.mark.integration

L = "layout-standby"
H = tuple(BlockHash(bytes([i]) * 16) for i in range(1, 5))
A = NodeId("node-a")


async def poll(cond: object, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not reached before the deadline"
        await asyncio.sleep(0.02)


def test_standby_serves_within_two_seconds_with_the_index_and_clients_fail_over(redis_url: str) -> None:
    async def body() -> None:
        ports = {"active": free_port(), "standby": free_port()}
        servers: dict[str, MetadataServer] = {}

        def starter(name: str):  # type: ignore[no-untyped-def]
            async def start() -> MetadataServer:
                service = MetadataService(RedisStore(redis_url), ServiceConfig(lease_ttl_s=30.0))
                server, _ = create_server(service, ServerOptions(port=ports[name], upkeep_interval_s=0.1))
                await server.start()
                servers[name] = server
                return server
            return start

        leases = {n: LeaderLease(redis_url, n, ttl_s=1.0) for n in ports}
        stop = {n: asyncio.Event() for n in ports}
        active = asyncio.create_task(serve_while_leader(leases["active"], starter("active"), stop["active"]))
        await poll(lambda: "active" in servers)
        standby = asyncio.create_task(serve_while_leader(leases["standby"], starter("standby"), stop["standby"]))
        client = MetadataClient(f"ipv4:127.0.0.1:{ports['active']},127.0.0.1:{ports['standby']}", timeout_s=1.0)
        try:
            await client.register(NodeInfo(A, 1, L, 16, 4096, "ucx://a", 100))
            await client.publish([EventBatch(A, 1, 1, (BlockStored(H, None, Tier.GPU),))])
            store = RedisStore(redis_url)
            await poll(lambda: store.load_index() is not None and b"\x01" * 16 in store.load_index())  # type: ignore[operator]
            store.close()
            assert "standby" not in servers  # it waits for the key
            active.cancel()  # dies: the key stays until its ttl ends
            died = time.monotonic()
            await asyncio.gather(active, return_exceptions=True)  # its port is closed now
            while True:
                try:
                    [found] = await client.match([MatchQuery(L, H)])
                    break
                except grpc.aio.AioRpcError:
                    assert time.monotonic() - died < 10.0
                    await asyncio.sleep(0.05)
            took = time.monotonic() - died
            assert "standby" in servers and took < 2.0, f"standby served after {took:.2f} s"
            assert [(n.node_id, n.gpu_blocks) for n in found.nodes] == [(A, 4)]
            lease = await client.heartbeat(A, 1, NodeLoad())  # the node's lease survived the takeover
            assert lease.next_seq == 2
        finally:
            stop["standby"].set()
            assert await standby is True
            await asyncio.gather(active, return_exceptions=True)
            await client.close()
            for lease_ in leases.values():
                await lease_.close()

    asyncio.run(body())


def test_two_leases_never_both_hold_the_key(redis_url: str) -> None:
    async def body() -> None:
        a, b = LeaderLease(redis_url, "a", ttl_s=5.0), LeaderLease(redis_url, "b", ttl_s=5.0)
        try:
            assert await a.try_acquire() and not await b.try_acquire()
            assert await a.renew() and not await b.renew()
            await b.release()  # not b's to release
            assert not await b.try_acquire()
            await a.release()
            assert await b.try_acquire() and not await a.renew()
        finally:
            await a.close()
            await b.close()

    asyncio.run(body())


def test_a_standby_needs_redis_state() -> None:
    with pytest.raises(ValueError, match="metadata_standby needs a redis"):
        LauncherConfig(metadata_standby=True)
