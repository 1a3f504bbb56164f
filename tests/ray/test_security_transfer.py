"""Attacks on the KV transfer plane, each refused with the requester's pool clean and the next honest
pull bitwise-correct: a requester without the secret, a host impersonating the owner, a malicious
owner (wrong bytes, a short chunk, reordered or swapped chunks, a huge chunk size) on UCX and on the
Ray fallback, a request altered on its way through Ray, and connections that never authenticate
(timeout, cap, oversized frames). A man in the middle of UCX pulls: test_pull_binding; a flood of
silent connections: test_transfer_flood."""

import asyncio
import functools
import struct
from collections.abc import Iterator
from typing import Any

import pytest
import ray

from radixmesh.cluster.launch.local_ray import init_loopback_ray
from radixmesh.common.block_pool.block_pool import BlockPool
from radixmesh.common.prefix_cache.prefix_cache import PrefixCache
from radixmesh.common.secret import ClusterSecret
from radixmesh.node_agent.transfer.binding import SessionBinding
from radixmesh.node_agent.transfer.client import PullConfig, PullOutcome, TransferClient
from radixmesh.node_agent.transfer.handshake import (
    HandshakeError,
    NodeIdentity,
    OwnerHandshake,
    ReplayGuard,
    RequesterHandshake,
)
from radixmesh.node_agent.transfer.plane import transport_by_name
from radixmesh.node_agent.transfer.protocol import (
    MAC_BYTES,
    Kind,
    PullRequest,
    Status,
    decode_header,
    encode_request,
)
from radixmesh.node_agent.transfer.ray_transport import encode_call
from radixmesh.node_agent.transfer.transport import Peer
from radixmesh.proto.events import Tier
from radixmesh.proto.ids import NodeId
from tests.node_agent.transfer import test_transfer_ucx
from tests.node_agent.transfer.test_transfer_ucx import Owner, Requester, assert_owner_clean
from tests.support import transfer_owner
from tests.support.transfer_owner import (
    LAYOUT,
    OWNER,
    REQUESTER,
    SECRET,
    OwnerSpec,
    build_source,
    kv_digest,
    make_transfer_actor,
    sequence_hashes,
    transfer_actor_name,
)

pytestmark = [pytest.mark.ray, pytest.mark.integration, pytest.mark.timeout(180)]
loop = test_transfer_ucx.loop  # the UCX tests' fixtures: one event loop, one owner process per module
owner = test_transfer_ucx.owner


def honest_pull_is_exact(loop: asyncio.AbstractEventLoop, o: Owner, mac: bool = False) -> None:
    """The owner still serves correct bytes to an honest requester."""
    req = Requester(loop, mac=mac)
    result = req.pull(o.peer(), sequence_hashes(12))
    assert (result.outcome, result.blocks) == (PullOutcome.OK, 12)
    assert kv_digest(req.kv, result.block_ids) == o.call("digest", 12)
    req.finish(result)
    assert_owner_clean(o)


# --- handshake units ---------------------------------------------------------------------------------
def test_handshake_proves_both_sides_and_agrees_on_a_key() -> None:
    r = RequesterHandshake(SECRET, REQUESTER, OWNER)
    o = OwnerHandshake(SECRET, OWNER)
    proof, mine = r.answer(o.challenge(r.hello()))
    theirs = o.verify(proof)
    assert (mine.peer, theirs.peer) == (OWNER, REQUESTER) and mine.key == theirs.key
    assert SECRET.value not in r.hello() + proof  # nothing secret travels


def test_handshake_refuses_impostors_either_way() -> None:
    r = RequesterHandshake(SECRET, REQUESTER, OWNER)
    impostor = OwnerHandshake(ClusterSecret.generate(), OWNER)
    with pytest.raises(HandshakeError, match="does not hold the credential of node owner"):
        r.answer(impostor.challenge(r.hello()))
    o = OwnerHandshake(SECRET, OWNER)
    o.challenge(RequesterHandshake(ClusterSecret.generate(), REQUESTER, OWNER).hello())
    with pytest.raises(HandshakeError, match="does not hold the credential of node requester"):
        o.verify(bytes(32))  # a stranger cannot compute the proof: any guess fails
    with pytest.raises(HandshakeError, match="not node-9"):
        OwnerHandshake(SECRET, OWNER).challenge(RequesterHandshake(SECRET, REQUESTER, NodeId("node-9")).hello())


def test_one_shot_handshake_refuses_a_replay() -> None:
    guard = ReplayGuard()
    message = RequesterHandshake(SECRET, REQUESTER, OWNER).one_shot()
    OwnerHandshake(SECRET, OWNER).one_shot(message, guard)
    with pytest.raises(HandshakeError, match="replayed"):
        OwnerHandshake(SECRET, OWNER).one_shot(message, guard)


# --- UCX: who may pull, who may answer ---------------------------------------------------------------
def test_unauthenticated_pull_is_refused_before_any_work(loop: asyncio.AbstractEventLoop, owner: Owner) -> None:
    before = owner.call("state")
    req = Requester(loop, secret=ClusterSecret.generate())
    result = req.pull(owner.peer(), sequence_hashes(8))
    assert (result.outcome, result.blocks) == (PullOutcome.UNAUTHENTICATED, 0)
    req.finish(result)
    # Nothing was served or pinned. (The owner counts the refusal when it reads the requester's
    # hang-up, which may come after this call returns: the count is not a synchronisation point.)
    after = owner.call("state")
    assert after["served"] == before["served"] and after["pinned"] == 0
    honest_pull_is_exact(loop, owner)


def test_an_impostor_owner_gets_no_hashes_and_gives_no_bytes(loop: asyncio.AbstractEventLoop) -> None:
    impostor = Owner(OwnerSpec(impostor=True))
    try:
        req = Requester(loop)
        result = req.pull(impostor.peer(), sequence_hashes(8))
        assert (result.outcome, result.blocks) == (PullOutcome.UNAUTHENTICATED, 0)
        assert req.cache.take_events() == []
        req.finish(result)
        assert impostor.call("state")["served"] == 0  # no request (no hash) ever reached it
    finally:
        impostor.stop()


# --- UCX: a malicious owner ----------------------------------------------------------------------------
@pytest.mark.parametrize(("fault", "mac", "outcome", "kept"), [
    ("corrupt", True, PullOutcome.CHECKSUM_MISMATCH, 3),      # wrong bytes
    ("swap", True, PullOutcome.CHECKSUM_MISMATCH, 3),         # chunk 2's bytes and checksum as chunk 1
    ("short", False, PullOutcome.PEER_LOST, 3),               # chunk 1 one block short
    ("reorder", False, PullOutcome.PEER_LOST, 3),             # chunk 2 sent before chunk 1
    ("huge_chunk_blocks", False, PullOutcome.INVALID_ARGUMENT, 0),
])
def test_a_malicious_owner_is_refused(loop: asyncio.AbstractEventLoop, owner: Owner, fault: str, mac: bool,
                                      outcome: PullOutcome, kept: int) -> None:
    assert owner.call("fault", fault) == "ok"
    req = Requester(loop, mac=mac)
    hashes = sequence_hashes(12)
    result = req.pull(owner.peer(), hashes)
    assert (result.outcome, result.blocks) == (outcome, kept)
    # What was kept is exactly the owner's bytes; nothing from the bad chunk on entered the cache.
    assert kv_digest(req.kv, result.block_ids) == owner.call("digest", kept)
    assert req.cache.longest_prefix(hashes) == kept
    req.finish(result)
    assert_owner_clean(owner)
    honest_pull_is_exact(loop, owner, mac=mac)


def test_mac_pull_is_exact(loop: asyncio.AbstractEventLoop, owner: Owner) -> None:
    honest_pull_is_exact(loop, owner, mac=True)


# --- UCX: connections that never authenticate ------------------------------------------------------
def test_silent_connections_time_out_and_the_cap_refuses_more(loop: asyncio.AbstractEventLoop) -> None:
    o = Owner(OwnerSpec(handshake_timeout_s=1.0, max_connections=2))

    async def body() -> None:
        # Accepted in order, so the two idle handlers hold both slots when the third arrives.
        idle = [await asyncio.open_connection("127.0.0.1", o.port) for _ in range(2)]
        third_reader, third_writer = await asyncio.open_connection("127.0.0.1", o.port)
        assert await third_reader.read() == b""  # closed at once: over the cap
        third_writer.close()
        for reader, writer in idle:
            assert await reader.read() == b""  # closed by the handshake timeout, not by us
            writer.close()

    try:
        loop.run_until_complete(body())
        assert o.call("state")["refused"] == 3
        honest_pull_is_exact(loop, o)
    finally:
        o.stop()


def test_an_oversized_handshake_frame_is_refused_unread(loop: asyncio.AbstractEventLoop, owner: Owner) -> None:
    async def body() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", owner.port)
        writer.write(struct.pack("<IB", 60 << 20, Kind.HELLO))  # announces 60 MiB, sends none
        await writer.drain()
        assert await reader.read() == b""
        writer.close()

    loop.run_until_complete(body())
    honest_pull_is_exact(loop, owner)


# --- Ray fallback: the same owner faults through the object store -----------------------------------
@pytest.fixture(scope="module")
def ray_owner() -> Iterator[Any]:
    init_loopback_ray(num_cpus=2, log_to_driver=False)
    ray.cloudpickle.register_pickle_by_value(transfer_owner)
    actor = make_transfer_actor(OWNER, functools.partial(build_source, OwnerSpec()))
    try:
        yield actor
    finally:
        ray.shutdown()


def ray_pull(secret: ClusterSecret, n: int, mac: bool = False) -> tuple[Any, TransferClient]:
    cache = PrefixCache(BlockPool(64, tier=Tier.HOST, block_bytes=LAYOUT.block_bytes))
    config = PullConfig(chunk_bytes=3 * LAYOUT.block_bytes, mac=mac)
    from_ray = transport_by_name("ray", NodeIdentity(secret, REQUESTER))
    client = TransferClient(cache, LAYOUT.new_cache(64), LAYOUT, config, from_ray)
    peer = Peer(OWNER, actor_name=transfer_actor_name(OWNER))
    return asyncio.run(client.pull(peer, sequence_hashes(n))), client


def ray_digest(n: int) -> str:
    replica = build_source(OwnerSpec())
    return kv_digest(replica.kv, replica.cache.match(sequence_hashes(n)))


@pytest.mark.slow
@pytest.mark.parametrize(("fault", "mac", "outcome", "kept"), [
    (None, False, PullOutcome.UNAUTHENTICATED, 0),            # a requester without the secret
    ("swap", True, PullOutcome.CHECKSUM_MISMATCH, 3),
    ("short", False, PullOutcome.PEER_LOST, 3),
    ("reorder", False, PullOutcome.PEER_LOST, 3),
    ("huge_chunk_blocks", False, PullOutcome.INVALID_ARGUMENT, 0),
])
def test_ray_attacks_are_refused(ray_owner: Any, fault: str | None, mac: bool, outcome: PullOutcome,
                                 kept: int) -> None:
    secret = SECRET if fault is not None else ClusterSecret.generate()
    if fault is not None:
        ray.get(ray_owner.fault.remote(fault))
    result, client = ray_pull(secret, 12, mac)
    assert (result.outcome, result.blocks) == (outcome, kept)
    assert kv_digest(client.kv, result.block_ids) == ray_digest(kept)
    client.cache.release(result.block_ids)
    assert client.cache.pool.num_in_use == 0
    assert ray.get(ray_owner.state.remote()) == {"pinned": 0, "in_use": 0}
    honest, client = ray_pull(SECRET, 12, mac)
    assert (honest.outcome, honest.blocks) == (PullOutcome.OK, 12)
    assert kv_digest(client.kv, honest.block_ids) == ray_digest(12)


@pytest.mark.slow
def test_ray_request_altered_after_sealing_is_refused_before_any_pin(ray_owner: Any) -> None:
    """A valid one-shot handshake travelling with a request whose hash list changed on the way: the
    owner answers UNAUTHENTICATED, without its proof, and pins nothing."""
    handshake = RequesterHandshake(SECRET, REQUESTER, OWNER)
    request = PullRequest(1, LAYOUT.fingerprint(), tuple(sequence_hashes(4)), 4, LAYOUT.block_bytes, "none")
    sealed, _ = SessionBinding(handshake.one_shot_session()).seal_request(encode_request(request))
    altered = bytearray(sealed)
    altered[-MAC_BYTES - 1] ^= 1  # the last byte of the last hash
    stream = ray_owner.pull.options(num_returns="streaming").remote(encode_call(handshake.one_shot(), bytes(altered)))
    proof, raw = ray.get(next(stream))
    assert proof == b"" and decode_header(raw[:-MAC_BYTES]).status is Status.UNAUTHENTICATED
    assert ray.get(ray_owner.state.remote()) == {"pinned": 0, "in_use": 0}
    honest, client = ray_pull(SECRET, 12)
    assert (honest.outcome, honest.blocks) == (PullOutcome.OK, 12)
    assert kv_digest(client.kv, honest.block_ids) == ray_digest(12)
