"""The Ray fallback transport: the owner's TransferActor in a Ray worker, the requester here."""

import asyncio
import functools
from collections.abc import Iterator
from typing import Any

import pytest
import ray

from radixmesh.cluster.launch.local_ray import init_loopback_ray
from radixmesh.common.block_pool.block_pool import BlockPool
from radixmesh.common.prefix_cache.prefix_cache import PrefixCache
from radixmesh.common.secret import ClusterSecret
from radixmesh.node_agent.transfer.client import PullConfig, PullOutcome, TransferClient
from radixmesh.node_agent.transfer.handshake import NodeIdentity
from radixmesh.node_agent.transfer.plane import transport_by_name
from radixmesh.node_agent.transfer.transport import Peer
from radixmesh.proto.events import Tier
from radixmesh.proto.ids import NodeId
from tests.support import transfer_owner
from tests.support.transfer_owner import (
    LAYOUT,
    REQUESTER,
    SECRET,
    OwnerSpec,
    build_source,
    kv_digest,
    make_transfer_actor,
    sequence_hashes,
    transfer_actor_name,
)

pytestmark = [pytest.mark.ray, pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def owner_actor() -> Iterator[Any]:
    # address="local": a fresh private instance, never a cluster another test left running here.
    init_loopback_ray(num_cpus=2, log_to_driver=False)
    # The owner builder lives in tests/, which Ray workers cannot import: ship it by value.
    ray.cloudpickle.register_pickle_by_value(transfer_owner)
    actor = make_transfer_actor(NodeId("owner"), functools.partial(build_source, OwnerSpec()))
    try:
        yield actor
    finally:
        ray.shutdown()


def pull_once(secret: ClusterSecret, n: int, *, mac: bool = False) -> tuple[Any, TransferClient]:
    pool = BlockPool(64, tier=Tier.HOST, block_bytes=LAYOUT.block_bytes)
    cache = PrefixCache(pool)
    config = PullConfig(chunk_bytes=3 * LAYOUT.block_bytes, mac=mac)
    transport = transport_by_name("ray", NodeIdentity(secret, REQUESTER))
    client = TransferClient(cache, LAYOUT.new_cache(64), LAYOUT, config, transport)
    return asyncio.run(client.pull(Peer(NodeId("owner"), actor_name=transfer_actor_name(NodeId("owner"))), sequence_hashes(n))), client


def test_ray_pull_is_bitwise_equal_and_partial(owner_actor: Any) -> None:
    result, client = pull_once(SECRET, 45)  # the owner holds 40 of them
    assert (result.outcome, result.blocks) == (PullOutcome.OK, 40)
    replica = build_source(OwnerSpec())
    assert kv_digest(client.kv, result.block_ids) == kv_digest(replica.kv, replica.cache.match(result.hashes))
    assert client.stats[NodeId("owner")].transport == "ray"
    client.cache.release(result.block_ids)
    client.cache.check_invariants()
    assert client.cache.pool.num_in_use == 0
    assert ray.get(owner_actor.state.remote()) == {"pinned": 0, "in_use": 0}


def test_ray_other_secret_is_refused(owner_actor: Any) -> None:
    result, client = pull_once(ClusterSecret.generate(), 8)
    assert (result.outcome, result.blocks) == (PullOutcome.UNAUTHENTICATED, 0)
    assert client.cache.pool.num_in_use == 0
    assert ray.get(owner_actor.state.remote()) == {"pinned": 0, "in_use": 0}
