"""The front's KV-event ingest bounds what it reads and knows which sources are authenticated
(issue 38, item 9): a frame past `max_message_bytes` is never read (the connection drops, the batch
is a gap and the engine's entries are forgotten), and an ipc source in a folder another user could
write is refused before anything is read. A real XPUB socket plays the engine, on 127.0.0.1."""

import os
from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest
import zmq
import zmq.asyncio

from radixmesh.cluster.fleet.ingest.subscriber import KVEventSubscriber, SubscriberConfig
from radixmesh.proto.vllm_kv_events import VllmEventBatch
from tests.support.poll import until

pytestmark = [pytest.mark.anyio, pytest.mark.integration]
LIMIT = 64 << 10


def payload(n_tokens: int) -> bytes:
    """A KVEventBatch storing blocks of `n_tokens` tokens (block size 16), vLLM main's map form."""
    event = {"type": "BlockStored", "block_hashes": list(range(n_tokens // 16)), "parent_block_hash": None,
             "token_ids": [70_000] * n_tokens, "block_size": 16, "lora_id": None, "medium": "GPU"}
    return msgpack.packb({"ts": 1.0, "events": [event]})


class Engine:
    """An XPUB the subscriber connects to; `subscribed(n)` says n subscriptions arrived (a reconnect
    subscribes again), which a test awaits instead of sleeping."""

    def __init__(self, ctx: zmq.asyncio.Context, address: str) -> None:
        self.pub = ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.setsockopt(zmq.XPUB_VERBOSE, 1)
        self.pub.bind(address)
        self.endpoint = self.pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self.subscriptions = 0

    async def subscribed(self, n: int) -> bool:
        while await self.pub.poll(0):
            self.subscriptions += (await self.pub.recv())[:1] == b"\x01"
        return self.subscriptions >= n

    async def send(self, seq: int, body: bytes) -> None:
        await self.pub.send_multipart((b"", seq.to_bytes(8, "big"), body))


@pytest.fixture
def ctx() -> Iterator[zmq.asyncio.Context]:
    context = zmq.asyncio.Context()
    yield context
    context.destroy(linger=0)


async def test_a_frame_past_the_bound_is_never_read_and_counts_as_a_gap(ctx: zmq.asyncio.Context) -> None:
    engine = Engine(ctx, "tcp://127.0.0.1:*")
    batches: list[VllmEventBatch] = []
    forgets: list[None] = []
    sub = KVEventSubscriber(SubscriberConfig(engine.endpoint, max_message_bytes=LIMIT), batches.append,
                            lambda: forgets.append(None), context=ctx)
    await sub.start()
    try:
        await until(lambda: engine.subscribed(1), "the subscriber to connect")
        await engine.send(0, payload(16))
        await until(lambda: sub.last_seq == 0, "batch 0")
        big = payload(LIMIT)  # ~3 bytes a token id: three times the bound
        assert len(big) > LIMIT
        await engine.send(1, big)
        await until(lambda: engine.subscribed(2), "the subscriber to drop the connection and come back")
        await engine.send(2, payload(32))
        await until(lambda: sub.last_seq == 2, "batch 2")
    finally:
        await sub.stop()
    # Batch 1 was never decoded: the next one is a gap, and what the engine held is forgotten.
    assert [len(b.events[0].token_ids) for b in batches] == [16, 32]  # type: ignore[union-attr]
    assert sub.stats.gaps == 1 and len(forgets) == 1 and sub.stats.dropped_connections == 1


async def test_an_ipc_source_others_could_bind_is_refused_before_reading(tmp_path: Path,
                                                                         ctx: zmq.asyncio.Context) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    config = SubscriberConfig(f"ipc://{shared}/engine.sock")
    sub = KVEventSubscriber(config, lambda b: None, lambda: None, context=ctx)
    with pytest.raises(ValueError, match="writable by nobody else"):
        await sub.start()
    assert config.authenticated  # an ipc path, which start() vets: refused here
    with pytest.raises(ValueError, match="abstract socket"):
        await KVEventSubscriber(SubscriberConfig("ipc://@engine"), lambda b: None, lambda: None,
                                context=ctx).start()


async def test_an_ipc_source_in_a_private_folder_is_followed(tmp_path: Path, ctx: zmq.asyncio.Context) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    engine = Engine(ctx, f"ipc://{private}/engine.sock")
    batches: list[VllmEventBatch] = []
    sub = KVEventSubscriber(SubscriberConfig(engine.endpoint), batches.append, lambda: None, context=ctx)
    assert sub.config.authenticated and not SubscriberConfig("tcp://127.0.0.1:5557").authenticated
    await sub.start()
    try:
        await until(lambda: engine.subscribed(1), "the subscriber to connect")
        await engine.send(0, payload(16))
        await until(lambda: sub.last_seq == 0, "batch 0")
    finally:
        await sub.stop()
    assert len(batches) == 1
