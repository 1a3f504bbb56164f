"""`up --metadata-standby`'s pair of metadata Ray actors on one Redis (local Ray): when the active
one stops, or is killed, the standby serves the same index and a client listing both addresses
fails over; the standby keeps the leader key while it serves."""

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
import ray
import redis

from radixmesh.cluster.launch.local_ray import init_loopback_ray
from radixmesh.cluster.launch.metadata_actor import (
    METADATA_ACTOR,
    METADATA_STANDBY_ACTOR,
    failover_target,
    make_metadata_actor,
)
from radixmesh.common.metadata.auth import CallerCredentials
from radixmesh.common.metadata.client import MetadataClient
from radixmesh.common.secret import ClusterSecret
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.events import BlockStored, Tier
from radixmesh.proto.ids import NodeId
from radixmesh.proto.metadata.messages import EventBatch, MatchQuery
from radixmesh.proto.metadata.nodes import NodeInfo
from tests.support.poll import until
from tests.support.servers import running_redis

pytestmark = [pytest.mark.ray, pytest.mark.integration, pytest.mark.timeout(120)]

L = "layout-standby-actors"
H = tuple(BlockHash(bytes([i]) * 16) for i in range(1, 5))
A = NodeId("node-a")
SECRET = ClusterSecret.generate()
LEADER_KEY = "radixmesh:leader"


@pytest.fixture(scope="module")
def ray_and_redis() -> Iterator[str]:
    with running_redis() as url:
        init_loopback_ray(num_cpus=1, log_to_driver=False)
        try:
            yield url
        finally:
            ray.shutdown()


async def match_through(client: MetadataClient) -> list[tuple[NodeId, int]]:
    """The index's answer for H, retried while the client reconnects to whichever one serves."""
    deadline = time.monotonic() + 15.0
    while True:
        try:
            [found] = await client.match([MatchQuery(L, H)])
            return [(n.node_id, n.gpu_blocks) for n in found.nodes]
        except grpc.aio.AioRpcError:
            assert time.monotonic() < deadline, "no metadata service answered"
            await asyncio.sleep(0.05)


LEADER_TTL_S = 4.0
"""Longer than the product's 1 s: an actor whose loop a busy 2-core box stalls past the ttl rightly
gives the key up (serve_while_leader), and the handover, not the ttl, is what this test is about."""


def test_the_standby_actor_takes_over_with_the_index_on_stop_then_on_kill(ray_and_redis: str) -> None:
    """A stops (clean: persists, releases the key): B serves. A starts again as the standby; B is
    killed (the key lives out its ttl): A serves. The index holds the same blocks throughout."""
    url = ray_and_redis
    keys = redis.Redis.from_url(url)

    async def body() -> None:
        a = make_metadata_actor("127.0.0.1", 0, url, 30.0, SECRET, "127.0.0.1", leader_lease=True,
                                name=METADATA_ACTOR, leader_ttl_s=LEADER_TTL_S)
        b = make_metadata_actor("127.0.0.1", 0, url, 30.0, SECRET, "127.0.0.1", leader_lease=True,
                                name=METADATA_STANDBY_ACTOR, leader_ttl_s=LEADER_TTL_S)
        addresses = [await a.start.remote()]
        addresses.append(await b.start.remote(wait=False))
        client = MetadataClient(failover_target(addresses), credentials=CallerCredentials.cluster(SECRET),
                                timeout_s=2.0)
        node = MetadataClient(failover_target(addresses), credentials=CallerCredentials.node(SECRET, A),
                              timeout_s=2.0)
        try:
            assert keys.get(LEADER_KEY) == addresses[0].encode()
            await node.register(NodeInfo(A, 1, L, 16, 4096, "ucx://a", 100))
            await node.publish([EventBatch(A, 1, 1, (BlockStored(H, None, Tier.GPU),))])
            assert await match_through(client) == [(A, 4)]
            assert not await b.serving.remote()

            await a.stop.remote()  # persists the index, releases the key
            await until(lambda: b.serving.remote())
            assert keys.get(LEADER_KEY) == addresses[1].encode()
            assert await match_through(client) == [(A, 4)]
            await _stays_leader(keys, addresses[1], b)

            await a.start.remote(wait=False)  # the pair has a standby again
            ray.kill(b)  # no persist, no release: A waits out the key's ttl
            await until(lambda: a.serving.remote())
            assert keys.get(LEADER_KEY) == addresses[0].encode()
            assert await match_through(client) == [(A, 4)]
            await _stays_leader(keys, addresses[0], a)
        finally:
            await client.close()
            await node.close()
            await a.stop.remote()
            ray.kill(a)
            ray.kill(b)

    asyncio.run(body())
    assert keys.get(LEADER_KEY) is None  # released on A's clean stop
    keys.close()


async def _stays_leader(keys: "redis.Redis[bytes]", address: str, actor: Any) -> None:
    """Regression: after a takeover the new leader reported a lost key. It must keep renewing."""
    last = [int(keys.pttl(LEADER_KEY))]
    for _ in range(3):
        await until(lambda: _renewed(keys, last), pause_s=0.02)
        assert await actor.serving.remote()
        assert keys.get(LEADER_KEY) == address.encode()


async def _renewed(keys: "redis.Redis[bytes]", last: list[int]) -> bool:
    """The key's remaining ttl rose since the last look (updated): a renewal. Compared with the
    previous look, not a fixed reading, which taken in a renewal's own millisecond is the full ttl,
    and no later renewal exceeds it."""
    now = int(keys.pttl(LEADER_KEY))
    risen, last[0] = now > last[0], now
    return risen

