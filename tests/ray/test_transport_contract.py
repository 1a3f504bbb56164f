"""The Transport contract (node_agent/transfer/transport.py), one suite run against every transport:
UCX (the owner's TransferServer in a spawned process) and Ray (the owner's TransferActor in a Ray
worker), each owner holding the first 40 blocks of one seeded sequence (tests/support/transfer_owner).
A pull brings the owner's exact bytes of the prefix it holds; a wrong credential is PeerUnauthenticated
and another layout the owner's refusal; an unreachable peer, a chunk out of order or short is a
TransportError; the owner keeps no pin after any of them. It lives under tests/ray/ because its Ray
half starts a Ray head."""

import asyncio
import dataclasses
import functools
import multiprocessing as mp
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import ray

from radixmesh.cluster.launch.local_ray import init_loopback_ray
from radixmesh.common.block_pool.block_pool import BlockPool
from radixmesh.common.prefix_cache.prefix_cache import PrefixCache
from radixmesh.common.secret import ClusterSecret
from radixmesh.node_agent.transfer.client import PullConfig, PullOutcome, PullResult, TransferClient
from radixmesh.node_agent.transfer.handshake import NodeIdentity
from radixmesh.node_agent.transfer.ray_transport import RayTransport
from radixmesh.node_agent.transfer.transport import Peer, Transport, TransportError
from radixmesh.node_agent.transfer.ucx_transport import UcxTransport
from radixmesh.proto.events import Tier
from radixmesh.proto.ids import NodeId
from radixmesh.proto.kv_layout import KVLayout
from tests.support import transfer_owner
from tests.support.servers import free_port
from tests.support.transfer_owner import (
    LAYOUT,
    OWNER,
    REQUESTER,
    SECRET,
    OwnerSpec,
    build_source,
    kv_digest,
    make_transfer_actor,
    run_owner,
    sequence_hashes,
    transfer_actor_name,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(180)]

HELD = OwnerSpec().cached  # 40 blocks
CHUNK_BLOCKS = 3


@dataclass
class Owner:
    """One transport's owner, as the suite sees it."""

    transport: Callable[[ClusterSecret], Transport]
    peer: Peer
    gone: Peer
    """A peer nobody serves."""
    fault: Callable[[str], None]
    """Make the owner's next pull misbehave (transfer_owner.FaultySource's faults)."""
    state: Callable[[], dict[str, int]]
    """Pins held and blocks in use, once the owner finished its pulls."""


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    # One loop for the module: ucxx binds its progress to the loop that first used it.
    lp = asyncio.new_event_loop()
    yield lp
    lp.close()


@pytest.fixture(scope="module")
def ucx_owner() -> Iterator[Owner]:
    ctx = mp.get_context("spawn")
    conn, child = ctx.Pipe()
    proc = ctx.Process(target=run_owner, args=(child, OwnerSpec()), daemon=True)
    proc.start()

    def call(*cmd: Any) -> Any:
        conn.send(cmd)
        return conn.recv()

    tag, port = conn.recv()
    assert tag == "ready"
    try:
        yield Owner(lambda secret: UcxTransport(NodeIdentity(secret, REQUESTER), loopback=True),
                    Peer(OWNER, "127.0.0.1", port), Peer(OWNER, "127.0.0.1", free_port()),
                    lambda name: call("fault", name), lambda: {k: v for k, v in call("state").items()
                                                               if k in ("pinned", "in_use")})
    finally:
        assert call("stop") == "stopped"
        proc.join(10)


@pytest.fixture(scope="module")
def ray_owner() -> Iterator[Owner]:
    # address="local": a fresh private instance, never a cluster another test left running here.
    init_loopback_ray(num_cpus=2, log_to_driver=False)
    # The owner builder lives in tests/, which Ray workers cannot import: ship it by value.
    ray.cloudpickle.register_pickle_by_value(transfer_owner)
    actor = make_transfer_actor(OWNER, functools.partial(build_source, OwnerSpec()))
    try:
        yield Owner(lambda secret: RayTransport(NodeIdentity(secret, REQUESTER)),
                    Peer(OWNER, actor_name=transfer_actor_name(OWNER)), Peer(OWNER, actor_name="nobody-serves-this"),
                    lambda name: ray.get(actor.fault.remote(name)), lambda: ray.get(actor.state.remote()))
    finally:
        ray.shutdown()


@pytest.fixture(params=["ucx", pytest.param("ray", marks=pytest.mark.ray)])
def owner(request: pytest.FixtureRequest) -> Owner:
    return request.getfixturevalue(f"{request.param}_owner")  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def expected_kv() -> Callable[[PullResult, TransferClient], bool]:
    """Whether a pull's blocks hold the owner's bytes: the owner's source rebuilt here from its seed."""
    replica = build_source(OwnerSpec())

    def same(result: PullResult, client: TransferClient) -> bool:
        return kv_digest(client.kv, result.block_ids) == kv_digest(replica.kv, replica.cache.match(result.hashes))
    return same


def pull(loop: asyncio.AbstractEventLoop, owner: Owner, n: int, secret: ClusterSecret = SECRET,
         expected: NodeId = OWNER, layout: KVLayout = LAYOUT) -> tuple[PullResult, TransferClient]:
    """Pull the first `n` blocks of the owner's sequence into a fresh pool, over a new client that
    takes the owner for node `expected`."""
    cache = PrefixCache(BlockPool(64, tier=Tier.HOST, block_bytes=layout.block_bytes))
    config = PullConfig(chunk_bytes=CHUNK_BLOCKS * layout.block_bytes, checksum="crc32")
    client = TransferClient(cache, layout.new_cache(64), layout, config, owner.transport(secret))
    peer = dataclasses.replace(owner.peer, node_id=expected)
    result = loop.run_until_complete(client.pull(peer, sequence_hashes(n)))
    loop.run_until_complete(client.close())
    return result, client


def release(result: PullResult, client: TransferClient) -> None:
    client.cache.release(result.block_ids)
    client.cache.check_invariants()
    assert client.cache.pool.num_in_use == 0


def test_a_pull_brings_the_owners_bytes_of_the_prefix_it_holds(loop: asyncio.AbstractEventLoop, owner: Owner,
                                                               expected_kv: Callable[..., bool]) -> None:
    result, client = pull(loop, owner, HELD + 5)
    assert (result.outcome, result.blocks, result.nbytes) == (PullOutcome.OK, HELD, HELD * LAYOUT.block_bytes)
    assert result.hashes == sequence_hashes(HELD)
    assert expected_kv(result, client)
    assert client.cache.pool.num_in_use == HELD  # the 5 surplus blocks went back to the pool
    assert client.stats[OWNER].transport == client.transport.name
    release(result, client)
    assert owner.state() == {"pinned": 0, "in_use": 0}


@pytest.mark.parametrize(("secret", "expected"), [
    pytest.param(ClusterSecret(bytes(32)), OWNER, id="other_cluster"),  # another cluster's requester
    pytest.param(SECRET, NodeId("node-7"), id="other_node"),  # one that expects another node there
])
def test_a_peer_that_does_not_prove_the_expected_credential_is_unauthenticated(
        loop: asyncio.AbstractEventLoop, owner: Owner, secret: ClusterSecret, expected: NodeId) -> None:
    result, client = pull(loop, owner, 8, secret, expected)
    assert (result.outcome, result.blocks, result.nbytes) == (PullOutcome.UNAUTHENTICATED, 0, 0)
    assert client.cache.pool.num_in_use == 0 and len(client.cache) == 0 and client.cache.take_events() == []
    assert owner.state() == {"pinned": 0, "in_use": 0}


def test_another_layout_is_refused_through_the_header(loop: asyncio.AbstractEventLoop, owner: Owner) -> None:
    other = dataclasses.replace(LAYOUT, dtype="float16")
    result, client = pull(loop, owner, 8, layout=other)
    assert (result.outcome, result.blocks) == (PullOutcome.LAYOUT_MISMATCH, 0)
    assert client.cache.pool.num_in_use == 0
    assert owner.state() == {"pinned": 0, "in_use": 0}


def test_a_peer_nobody_serves_is_a_transport_error(loop: asyncio.AbstractEventLoop, owner: Owner) -> None:
    with pytest.raises(TransportError):
        loop.run_until_complete(owner.transport(SECRET).connect(owner.gone))


@pytest.mark.parametrize(("fault", "outcome"), [
    ("reorder", PullOutcome.PEER_LOST),  # chunk 2 sent as the second: the channel raises
    ("short", PullOutcome.PEER_LOST),  # chunk 1 a block short: the channel raises
    ("corrupt", PullOutcome.CHECKSUM_MISMATCH),  # a byte of chunk 1 flipped: delivered as sent
])
def test_a_misbehaving_owner_leaves_the_chunks_before_its_fault(loop: asyncio.AbstractEventLoop, owner: Owner,
                                                                expected_kv: Callable[..., bool],
                                                                fault: str, outcome: PullOutcome) -> None:
    owner.fault(fault)
    result, client = pull(loop, owner, 12)
    assert (result.outcome, result.blocks) == (outcome, CHUNK_BLOCKS)  # chunk 0 only
    assert expected_kv(result, client)
    release(result, client)
    assert owner.state() == {"pinned": 0, "in_use": 0}
    again, client = pull(loop, owner, 12)  # the owner serves the next pull as usual
    assert (again.outcome, again.blocks) == (PullOutcome.OK, 12)
    release(again, client)
