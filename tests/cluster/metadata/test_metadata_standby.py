"""A standby metadata service on the same Redis takes over when the active one dies: within 2 s,
with the nodes' leases and the index restored, and clients listing both addresses fail over."""

import asyncio
import time

import grpc
import pytest
import redis.asyncio

from radixmesh.cluster.launch.config import LauncherConfig
from radixmesh.cluster.metadata.leader import LeaderLease, serve_while_leader
from radixmesh.cluster.metadata.server import MetadataServer
from radixmesh.cluster.metadata.service import MetadataService
from radixmesh.cluster.metadata.service_config import ServiceConfig
from radixmesh.cluster.metadata.store import RedisStore
from radixmesh.common.metadata.client import MetadataClient
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.events import BlockStored, Tier
from radixmesh.proto.ids import NodeId
from radixmesh.proto.metadata.messages import EventBatch, MatchQuery
from radixmesh.proto.metadata.nodes import NodeInfo, NodeLoad
from tests.support.poll import until
from tests.support.servers import free_port, start_metadata_server

pytestmark = pytest.mark.integration

L = "layout-standby"
H = tuple(BlockHash(bytes([i]) * 16) for i in range(1, 5))
A = NodeId("node-a")


def test_standby_serves_within_two_seconds_with_the_index_and_clients_fail_over(redis_url: str) -> None:
    async def body() -> None:
        ports = {"active": free_port(), "standby": free_port()}
        servers: dict[str, MetadataServer] = {}
        started: dict[str, tuple[float, float]] = {}
        """Per server, time.monotonic() when its start began (it held the key) and when it served."""

        def starter(name: str):  # type: ignore[no-untyped-def]
            async def start() -> MetadataServer:
                began = time.monotonic()
                service = MetadataService(RedisStore(redis_url), ServiceConfig(lease_ttl_s=30.0))
                server, _ = await start_metadata_server(service, port=ports[name], upkeep_interval_s=0.1)
                servers[name] = server
                started[name] = began, time.monotonic()
                return server
            return start

        leases = {n: LeaderLease(redis_url, n, ttl_s=1.0) for n in ports}
        stop = {n: asyncio.Event() for n in ports}
        active = asyncio.create_task(serve_while_leader(leases["active"], starter("active"), stop["active"]))
        await until(lambda: "active" in servers)
        standby = asyncio.create_task(serve_while_leader(leases["standby"], starter("standby"), stop["standby"]))
        client = MetadataClient(f"ipv4:127.0.0.1:{ports['active']},127.0.0.1:{ports['standby']}", timeout_s=1.0)
        try:
            await client.register(NodeInfo(A, 1, L, 16, 4096, "ucx://a", 100))
            await client.publish([EventBatch(A, 1, 1, (BlockStored(H, None, Tier.GPU),))])
            store = RedisStore(redis_url)
            await until(lambda: store.load_index() is not None and b"\x01" * 16 in store.load_index())  # type: ignore[operator]
            store.close()
            assert "standby" not in servers  # it waits for the key
            active.cancel()  # dies: cancelled, it releases the key (test_a_cancelled_leader_releases_the_key)
            died = time.monotonic()
            await asyncio.gather(active, return_exceptions=True)  # its port is closed now
            while True:
                try:
                    [found] = await client.match([MatchQuery(L, H)])
                    break
                except grpc.aio.AioRpcError:
                    assert time.monotonic() - died < 60.0, "no answer from the standby"
                    await asyncio.sleep(0.05)
            took = time.monotonic() - died
            assert "standby" in servers, "the answer came from a server other than the standby"
            began, serving = started["standby"]
            # The 2 s are waiting (the standby's poll for the key, the client's reconnect); the standby's
            # own start (restoring the index from Redis, binding), which a loaded box stretches, is not.
            assert took - (serving - began) < 2.0, f"served after {took:.2f} s, {serving - began:.2f} s of it its start"
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


def test_the_key_is_renewed_while_the_server_starts(redis_url: str) -> None:
    """Regression: renewing began only once `start` returned, so a start slower than the ttl (the
    service restores the index from Redis) served without the key, and the standby took it."""
    async def body() -> None:
        lease = LeaderLease(redis_url, "slow", ttl_s=3.0)
        keys = redis.asyncio.Redis.from_url(redis_url)
        stop = asyncio.Event()
        renewed = asyncio.Event()
        succeeded = asyncio.Event()
        renew = lease.renew

        async def counted_renew() -> bool | None:
            answer = await renew()
            if answer:
                succeeded.set()
            return answer

        lease.renew = counted_renew  # type: ignore[method-assign]

        async def slow_start() -> MetadataServer:
            # The server is built only once a renewal went through: without renewing during the
            # start, this start would outlast the ttl. Waiting on the renewal itself, not on the
            # key's ttl, holds on a loaded host where one round trip may take its whole timeout.
            await succeeded.wait()
            assert await keys.get(lease.key) == b"slow", "the key expired while the server started"
            renewed.set()
            server, _ = await start_metadata_server()
            return server

        leading = asyncio.create_task(serve_while_leader(lease, slow_start, stop))
        try:
            await asyncio.wait_for(renewed.wait(), 60.0)
            assert await keys.get(lease.key) == b"slow"
        finally:
            stop.set()
            assert await leading is True
            assert await keys.get(lease.key) is None  # released on the clean stop
            await lease.close()
            await keys.aclose()

    asyncio.run(body())


def test_a_cancelled_leader_releases_the_key(redis_url: str) -> None:
    """Regression: cancelling the serving task was reported as a lost key and left the key held for
    its ttl (10 s with --leader-ttl 10), so the standby waited that long to take over."""
    async def body() -> None:
        lease = LeaderLease(redis_url, "cancelled", ttl_s=30.0)
        keys = redis.asyncio.Redis.from_url(redis_url)
        started: list[MetadataServer] = []

        async def start() -> MetadataServer:
            server, _ = await start_metadata_server()
            started.append(server)
            return server

        leading = asyncio.create_task(serve_while_leader(lease, start, asyncio.Event()))
        try:
            await until(lambda: bool(started))
            assert await keys.get(lease.key) == b"cancelled"
            leading.cancel()
            with pytest.raises(asyncio.CancelledError):
                await leading
            assert await keys.get(lease.key) is None
        finally:
            await lease.close()
            await keys.aclose()

    asyncio.run(body())


def test_stop_while_waiting_for_the_key_returns_without_serving(redis_url: str) -> None:
    async def body() -> None:
        holder, waiter = LeaderLease(redis_url, "holder", ttl_s=30.0), LeaderLease(redis_url, "waiter", ttl_s=30.0)
        stop = asyncio.Event()

        async def start() -> MetadataServer:
            raise AssertionError("a stopped standby must not serve")

        try:
            assert await holder.try_acquire()
            waiting = asyncio.create_task(serve_while_leader(waiter, start, stop))
            stop.set()
            assert await waiting is True
            assert await holder.renew()  # still the holder's
        finally:
            await holder.close()
            await waiter.close()

    asyncio.run(body())


class ScriptedLease(LeaderLease):
    """A lease whose renewals answer from a script (True held, False lost, None Redis silent)."""

    def __init__(self, answers: list[bool | None], ttl_s: float) -> None:
        super().__init__(f"redis://127.0.0.1:{free_port()}/0", "a", ttl_s=ttl_s)
        self.answers, self.asked = answers, 0

    async def renew(self) -> bool | None:
        self.asked += 1
        return self.answers.pop(0) if self.answers else None


RENEW_TTL_S = 1.2
"""The scripted leases' ttl. keep() waits ttl / 3 between renewals and compares its clock with the
key's expiry, so a loop that wakes late (a loaded box) skips retries: a third of this ttl (0.4 s) is
the lateness the two tests below tolerate, at ~1.3 s each."""


def test_one_unanswered_renewal_keeps_the_lease_and_a_lost_key_ends_it() -> None:
    lease = ScriptedLease([None, True, None, True, False], ttl_s=RENEW_TTL_S)
    asyncio.run(asyncio.wait_for(lease.keep(), 10 * RENEW_TTL_S))
    assert lease.asked == 5  # went on past both silent renewals, stopped at the lost key


def test_renewals_unanswered_for_a_whole_ttl_end_the_lease() -> None:
    lease = ScriptedLease([True], ttl_s=RENEW_TTL_S)
    started = time.monotonic()
    asyncio.run(asyncio.wait_for(lease.keep(), 10 * RENEW_TTL_S))
    # Not given up while the key was surely held: the answered renewal (ttl / 3 in) kept it a whole
    # ttl, and a retry is dropped only when its answer could come after that (a lower bound: a loaded
    # box only makes it later).
    assert time.monotonic() - started >= RENEW_TTL_S
    # The silent ones were retried before giving up, and not for ever: retries every ttl / 20 over the
    # last third of the ttl are at most 7 (a loop that wakes late asks fewer), so at most 9 asks with
    # the answered one and the first silent one; retrying past the expiry would ask more.
    assert 3 <= lease.asked <= 9, lease.asked
