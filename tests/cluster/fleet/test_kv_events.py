"""KV-event ingestion from external engines: vLLM's events (golden bytes from vLLM's own publisher,
decoded by proto/vllm_kv_events.py, tested in tests/proto) translated into our chained hashes,
followed in sequence order over real ZMQ sockets."""

import asyncio
import contextlib
from collections.abc import AsyncIterator

import msgpack
import pytest
import zmq
import zmq.asyncio

from radixmesh.cluster.fleet.ingest.block_map import EngineBlockMap
from radixmesh.cluster.fleet.ingest.external_engine import ExternalEngineConfig, ExternalEngineNode
from radixmesh.cluster.fleet.ingest.subscriber import KVEventSubscriber, SubscriberConfig
from radixmesh.proto.block_hash import hash_blocks, tenant_salt
from radixmesh.proto.events import AllCleared, BlockRemoved, BlockStored, Tier
from radixmesh.proto.ids import NodeId
from radixmesh.proto.vllm_kv_events import (
    EventDecodeError,
    VllmBlockRemoved,
    VllmBlockStored,
    decode_batch,
    decode_seq,
)
from tests.support.poll import until
from tests.support.vllm_golden import MAIN_PAYLOAD, PUB


def h(i: int) -> bytes:
    return bytes([i]) * 32


# --- translation into our hashes ----------------------------------------------------------------
def test_blocks_translate_to_our_chained_hashes() -> None:
    m = EngineBlockMap(4)
    ours = hash_blocks(range(12), 4)
    out = [m.apply(decode_batch(f[2]).events) for f in PUB]
    m.check_invariants()
    assert out[0] == [BlockStored((ours[0], ours[1]), None, Tier.GPU)]
    assert out[1] == [BlockStored((ours[2],), ours[1], Tier.GPU),
                      BlockStored(tuple(hash_blocks([100, 101, 102, 103], 4)), None, Tier.HOST)]
    assert out[2] == [BlockRemoved((ours[2],), Tier.GPU)]
    assert out[3] == [AllCleared()]
    assert out[4] == [] and m.skipped["lora"] == 1  # an adapter's KV is not the base model's
    assert len(m) == 0


def test_engine_blocks_span_several_of_ours() -> None:
    m = EngineBlockMap(2)
    ours = hash_blocks(range(12), 2)
    assert m.apply(decode_batch(PUB[0][2]).events) == [BlockStored(tuple(ours[:4]), None, Tier.GPU)]
    assert m.stored(VllmBlockStored((h(3),), h(2), (8, 9, 10, 11), 4)) == [
        BlockStored(tuple(ours[4:6]), ours[3], Tier.GPU)]
    assert m.removed(VllmBlockRemoved((h(2),), "GPU")) == [BlockRemoved((ours[2], ours[3]), Tier.GPU)]
    assert EngineBlockMap(3).apply(decode_batch(PUB[0][2]).events) == []
    m.check_invariants()


def test_cache_salt_becomes_our_tenant_salt_and_multimodal_blocks_are_skipped() -> None:
    m = EngineBlockMap(4)
    salted = hash_blocks(range(8), 4, salt=tenant_salt("tenant-a"))
    assert m.apply(decode_batch(MAIN_PAYLOAD).events) == [
        BlockStored(tuple(salted), None, Tier.GPU), BlockRemoved((salted[1],), Tier.GPU), AllCleared()]
    assert m.skipped["extra_keys"] == 1
    m.check_invariants()


def test_a_child_reasserts_its_forgotten_ancestors_on_the_gpu() -> None:
    m = EngineBlockMap(4)
    ours = hash_blocks([*range(8), 20, 21, 22, 23], 4)
    m.apply(decode_batch(PUB[0][2]).events)
    assert m.forget_holdings() == [AllCleared()] and len(m) == 0
    # The request that filled the child holds its prefix: both ancestors are on the gpu again.
    assert m.stored(VllmBlockStored((h(5),), h(2), (20, 21, 22, 23), 4, medium="GPU")) == [
        BlockStored((ours[0], ours[1]), None, Tier.GPU), BlockStored((ours[2],), ours[1], Tier.GPU)]
    assert len(m) == 3
    assert m.chains() == [BlockStored(tuple(ours), None, Tier.GPU)]
    m.check_invariants()


def test_unknown_parents_media_and_groups_are_skipped() -> None:
    m = EngineBlockMap(4)
    assert m.stored(VllmBlockStored((h(9),), h(8), (1, 2, 3, 4), 4)) == []
    assert m.stored(VllmBlockStored((h(9),), None, (1, 2, 3, 4), 4, medium="DISK")) == []
    assert m.stored(VllmBlockStored((h(9),), None, (1, 2, 3, 4), 4, group_idx=1)) == []
    assert m.stored(VllmBlockStored((h(9),), None, (1, 2, 3), 4)) == []
    assert dict(m.skipped) == {"unknown_parent": 1, "medium": 1, "kv_group": 1, "malformed": 1}
    assert m.removed(VllmBlockRemoved((h(9),), "GPU")) == []
    m.check_invariants()


def test_translations_of_unheld_blocks_are_bounded() -> None:
    m = EngineBlockMap(4, max_unheld=1)
    m.apply(decode_batch(PUB[0][2]).events)
    m.removed(VllmBlockRemoved((h(1), h(2)), "GPU"))
    m.check_invariants()
    assert m.our_hashes(h(1)) is None and m.our_hashes(h(2)) is not None  # oldest forgotten first


def test_snapshot_chains_cover_both_tiers() -> None:
    m = EngineBlockMap(4)
    m.apply(decode_batch(PUB[0][2]).events)
    m.apply(decode_batch(PUB[1][2]).events)
    assert m.chains() == [BlockStored(tuple(hash_blocks(range(12), 4)), None, Tier.GPU),
                          BlockStored(tuple(hash_blocks([100, 101, 102, 103], 4)), None, Tier.HOST)]


# --- following the stream over real ZMQ sockets -------------------------------------------------
def payload(ts: float) -> bytes:
    return msgpack.packb([ts, [], 0])


class Engine:
    """A PUB side on 127.0.0.1 (XPUB, so the test can wait for the subscription instead of sleeping)
    and, optionally, a replay ROUTER answering like vLLM's ZmqEventPublisher._service_replay."""

    def __init__(self, ctx: zmq.asyncio.Context) -> None:
        self.pub = ctx.socket(zmq.XPUB)
        self.pub_port = self.pub.bind_to_random_port("tcp://127.0.0.1")
        self.router = ctx.socket(zmq.ROUTER)
        self.replay_port = self.router.bind_to_random_port("tcp://127.0.0.1")
        self.buffer: dict[int, bytes] = {}
        self._task = asyncio.create_task(self._serve_replay())

    async def wait_subscribed(self) -> None:
        async with asyncio.timeout(10):
            assert (await self.pub.recv())[:1] == b"\x01"

    async def send(self, seq: int, body: bytes, *, publish: bool = True) -> None:
        self.buffer[seq] = body
        if publish:
            await self.pub.send_multipart((b"kv", seq.to_bytes(8, "big"), body))

    async def _serve_replay(self) -> None:
        while True:
            client, _, start = await self.router.recv_multipart()
            for seq in sorted(self.buffer):
                if seq >= int.from_bytes(start, "big"):
                    await self.router.send_multipart((client, b"", seq.to_bytes(8, "big"), self.buffer[seq]))
            await self.router.send_multipart((client, b"", (-1).to_bytes(8, "big", signed=True), b""))

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self.pub.close(0)
        self.router.close(0)


@contextlib.asynccontextmanager
async def following(replay: bool) -> AsyncIterator[tuple[Engine, KVEventSubscriber, list[float], list[int]]]:
    ctx = zmq.asyncio.Context()
    engine = Engine(ctx)
    seen: list[float] = []
    forgets: list[int] = []
    config = SubscriberConfig(f"tcp://127.0.0.1:{engine.pub_port}",
                              f"tcp://127.0.0.1:{engine.replay_port}" if replay else None, replay_timeout_s=5.0)
    sub = KVEventSubscriber(config, lambda b: seen.append(b.ts), lambda: forgets.append(len(seen)), context=ctx)
    await sub.start()
    try:
        await engine.wait_subscribed()
        yield engine, sub, seen, forgets
    finally:
        await sub.stop()
        await engine.close()
        ctx.term()


@pytest.mark.anyio
async def test_golden_frames_arrive_in_order() -> None:
    async with following(replay=False) as (engine, sub, seen, forgets):
        for _, seq, body in PUB:
            await engine.send(decode_seq(seq), body)
        await until(lambda: sub.last_seq == 4, "all five batches")
        assert seen == [1700000000.0 + i for i in range(5)] and forgets == []


@pytest.mark.anyio
async def test_a_gap_without_replay_forgets_the_engine_blocks() -> None:
    async with following(replay=False) as (engine, sub, seen, forgets):
        await engine.send(0, payload(0))
        await engine.send(2, payload(2))
        await until(lambda: sub.last_seq == 2, "batch 2")
        assert seen == [0, 2] and forgets == [1] and sub.stats.gaps == 1


@pytest.mark.anyio
async def test_a_gap_is_filled_from_the_replay_socket() -> None:
    async with following(replay=True) as (engine, sub, seen, forgets):
        await engine.send(0, payload(0))
        await until(lambda: sub.last_seq == 0, "batch 0")
        await engine.send(1, payload(1), publish=False)  # lost on the way, kept for replay
        await engine.send(2, payload(2))
        await until(lambda: sub.last_seq == 2, "batch 2")
        assert seen == [0, 1, 2] and forgets == [] and sub.stats.replayed_batches >= 2


@pytest.mark.anyio
async def test_a_replay_that_no_longer_reaches_back_forgets() -> None:
    async with following(replay=True) as (engine, sub, seen, forgets):
        await engine.send(0, payload(0))
        await until(lambda: sub.last_seq == 0, "batch 0")
        await engine.send(2, payload(2), publish=False)  # batch 1 fell out of the engine's buffer
        await engine.send(3, payload(3))
        await until(lambda: sub.last_seq == 3, "batch 3")
        assert seen == [0, 2, 3] and forgets == [1]


@pytest.mark.anyio
async def test_joining_late_replays_what_the_engine_still_buffers() -> None:
    async with following(replay=True) as (engine, sub, seen, forgets):
        for seq in (0, 1, 2):
            await engine.send(seq, payload(seq), publish=False)
        await engine.send(3, payload(3))
        await until(lambda: sub.last_seq == 3, "batch 3")
        assert seen == [0, 1, 2, 3] and forgets == []


@pytest.mark.anyio
async def test_a_restarted_engine_is_forgotten_and_followed_again() -> None:
    async with following(replay=False) as (engine, sub, seen, forgets):
        await engine.send(0, payload(0))
        await engine.send(1, payload(1))
        await until(lambda: sub.last_seq == 1, "batch 1")
        await engine.send(0, payload(10))
        await until(lambda: len(seen) == 3, "the restarted engine's batch 0")
        assert seen == [0, 1, 10] and forgets == [2] and sub.stats.restarts == 1


@pytest.mark.anyio
async def test_a_payload_that_does_not_decode_is_a_lost_batch() -> None:
    async with following(replay=False) as (engine, sub, seen, forgets):
        await engine.send(0, payload(0))
        await engine.send(1, b"\xc1garbage")
        await engine.send(2, payload(2))
        await until(lambda: sub.last_seq == 2, "batch 2")
        assert seen == [0, 2] and forgets == [1] and sub.stats.bad_payloads == 1


def test_sglang_events_with_metadata_and_pinned_host_memory() -> None:
    # sglang/srt/disaggregation/kv_events.py: array_like without omit_defaults, int hashes, a salted
    # request's BlockStoredWithMetadata appends {"cache_salt": ...}; host memory is "CPU_PINNED".
    body = msgpack.packb([1.5, [
        ["BlockStored", [11, 12], None, list(range(8)), 4, None, "GPU", {"cache_salt": "acme"}],
        ["BlockStored", [13], None, [9, 9, 9, 9], 4, None, "CPU_PINNED"],
        ["BlockRemoved", [12], "GPU"],
    ], 0])
    batch = decode_batch(body)
    assert batch.events[0] == VllmBlockStored((11, 12), None, tuple(range(8)), 4, None, "GPU", cache_salt="acme")
    salted = hash_blocks(range(8), 4, salt=tenant_salt("acme"))
    assert EngineBlockMap(4).apply(batch.events) == [
        BlockStored(tuple(salted), None, Tier.GPU),
        BlockStored(tuple(hash_blocks([9, 9, 9, 9], 4)), None, Tier.HOST),
        BlockRemoved((salted[1],), Tier.GPU)]
    with pytest.raises(EventDecodeError):
        decode_batch(msgpack.packb([1.5, [["BlockStored", [1], None, [1], 1, None, "GPU", {"cache_salt": 5}]]]))


@pytest.mark.anyio
async def test_an_engine_node_without_a_publisher_keeps_no_events() -> None:
    config = ExternalEngineConfig(NodeId("e"), "http://127.0.0.1:1", SubscriberConfig("tcp://127.0.0.1:1"), "l", "m",
                                  block_size=4)
    quiet, loud = ExternalEngineNode(config, publishing=False), ExternalEngineNode(config)
    for node in (quiet, loud):
        node.on_batch(decode_batch(PUB[0][2]))
        node.on_gap()
    assert await quiet.take_events() == [] and len(quiet.blocks.chains()) == 0
    assert await loud.take_events() == [BlockStored(tuple(hash_blocks(range(8), 4)), None, Tier.GPU), AllCleared()]
