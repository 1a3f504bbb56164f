"""Issue 38 item 4: over tcp an agent's KV-events sockets are CURVE servers that admit only the
cluster secret's client key. A subscriber or replay peer with another key, or none, is refused
before any subscription or request of its reaches the publisher, and reads nothing."""

import contextlib
from collections.abc import AsyncIterator

import pytest
import zmq
import zmq.asyncio

from radixmesh.common.kv_events_curve import connect_curve
from radixmesh.common.secret import ClusterSecret
from radixmesh.node_agent.kv_events.publisher import ZmqKVEventPublisher
from radixmesh.node_agent.kv_events.token_book import TokenBook
from radixmesh.proto.block_hash import hash_blocks
from radixmesh.proto.events import BlockStored, Tier
from radixmesh.proto.vllm_kv_events import REPLAY_END, decode_seq, replay_request
from tests.support.agents import SECRET, prompt
from tests.support.poll import until
from tests.support.tiny_model import BS

pytestmark = pytest.mark.anyio


@contextlib.asynccontextmanager
async def curve_publisher() -> AsyncIterator[tuple[ZmqKVEventPublisher, zmq.asyncio.Context]]:
    publisher = ZmqKVEventPublisher("tcp://127.0.0.1:0", TokenBook(BS), secret=SECRET)
    await publisher.start()
    ctx = zmq.asyncio.Context()
    try:
        yield publisher, ctx
    finally:
        await publisher.stop()
        ctx.destroy(linger=0)


def stranger(sock: zmq.Socket[bytes]) -> None:
    """A CURVE client that knows the server's public key but has a key pair of its own."""
    public, private = zmq.curve_keypair()
    connect_curve(sock, SECRET)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, public)
    sock.setsockopt(zmq.CURVE_SECRETKEY, private)


def publish_one(publisher: ZmqKVEventPublisher, seed: int) -> None:
    tokens = prompt(seed, 2 * BS)
    hashes = hash_blocks(tokens, BS)
    publisher.book.close(publisher.book.open(tokens, hashes, None))
    publisher.offer([BlockStored(tuple(hashes), None, Tier.GPU)])


async def test_only_a_subscriber_with_the_clusters_key_reads_the_events() -> None:
    async with curve_publisher() as (publisher, ctx):
        member, other, plain, wrong = (ctx.socket(zmq.SUB) for _ in range(4))
        connect_curve(member, SECRET)
        stranger(other)
        connect_curve(wrong, ClusterSecret(b"\x07" * 32))  # another cluster: the server's key is not theirs
        for sock in (member, other, plain, wrong):
            sock.setsockopt(zmq.SUBSCRIBE, b"")
            sock.connect(publisher.endpoint)
        await until(lambda: publisher.subscriptions == 1 and publisher.refused_clients >= 1,
                    "the member's subscription and the stranger's refusal")
        publish_one(publisher, 1)
        frames = await member.recv_multipart()
        assert decode_seq(frames[1]) == 0
        # The batch went out once, to the one subscription the publisher ever applied.
        assert publisher.subscriptions == 1
        assert [await s.poll(0) for s in (other, plain, wrong)] == [0, 0, 0]


async def test_the_replay_socket_answers_only_the_clusters_key() -> None:
    async with curve_publisher() as (publisher, ctx):
        publish_one(publisher, 2)
        await until(lambda: publisher.published == 1, "one batch")
        member, other = ctx.socket(zmq.DEALER), ctx.socket(zmq.DEALER)
        connect_curve(member, SECRET)
        stranger(other)
        for sock in (member, other):
            sock.connect(publisher.replay_endpoint)
            await sock.send_multipart(replay_request(0))
        replies = [await member.recv_multipart()]
        while replies[-1] != list(REPLAY_END):
            replies.append(await member.recv_multipart())
        assert [decode_seq(r[1]) for r in replies] == [0, -1]
        await until(lambda: publisher.refused_clients >= 1, "the stranger's refusal")
        assert await other.poll(0) == 0
