"""Background tasks that follow a stream survive what they did not expect (issue 28, finding 11): a
malformed KV event is counted and dropped (a msgpack map with an array key used to end the ingest task
with a TypeError), and the ingest task and the router's index watch are supervised: restarted with
backoff, their restarts counted, what they feed forgotten meanwhile (the index replica says it is out
of sync instead of answering from a copy that stopped following)."""

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import cast

import msgpack
import pytest
import zmq.asyncio
from hypothesis import given
from hypothesis import strategies as st

from radixmesh.cluster.fleet.ingest.block_map import EngineBlockMap
from radixmesh.cluster.fleet.ingest.external_engine import ingest_stats
from radixmesh.cluster.fleet.ingest.subscriber import KVEventSubscriber, SubscriberConfig
from radixmesh.cluster.fleet.supervised_task import SupervisedTask
from radixmesh.cluster.router.index_watch import IndexWatcher, IndexWatchStats
from radixmesh.common.backoff import Backoff
from radixmesh.common.metadata.client import MetadataClient
from radixmesh.common.metrics.exposition import render_prometheus
from radixmesh.proto.metadata.messages import IndexUpdate
from radixmesh.proto.vllm_kv_events import EventDecodeError, VllmEventBatch, decode_batch
from tests.cluster.fleet.test_kv_events import Engine, payload
from tests.support.poll import until

FAIL_FAST_S = 5.0
"""How long a test waits for what the fix makes happen at once (today's code never does it)."""


# --- SupervisedTask -----------------------------------------------------------------------------
class Script:
    """A body that fails `failures` times (each run taking `run_s` on a fake clock), then blocks."""

    def __init__(self, failures: int, run_s: float = 0.0) -> None:
        self.failures = failures
        self.run_s = run_s
        self.now = 0.0
        self.runs = 0
        self.pauses: list[float] = []
        self.blocked = asyncio.Event()

    async def body(self) -> None:
        self.runs += 1
        self.now += self.run_s
        if self.runs <= self.failures:
            raise RuntimeError(f"failure {self.runs}")
        self.blocked.set()
        await asyncio.Event().wait()

    async def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)


@pytest.mark.anyio
async def test_a_failing_body_restarts_with_doubling_capped_backoff_and_counts_restarts() -> None:
    script = Script(failures=5)
    failures: list[Exception] = []
    task = SupervisedTask("t", script.body, failures.append, backoff=Backoff(0.1, 0.5),
                          clock=lambda: script.now, sleep=script.sleep)
    task.start()
    await script.blocked.wait()
    assert task.restarts == 5 and script.runs == 6
    assert script.pauses == [0.1, 0.2, 0.4, 0.5, 0.5]
    assert [str(e) for e in failures] == [f"failure {i}" for i in range(1, 6)]
    await task.stop()
    assert not task.running


@pytest.mark.anyio
async def test_a_body_that_ran_healthy_for_max_s_restarts_after_the_initial_pause() -> None:
    script = Script(failures=3, run_s=0.5)
    task = SupervisedTask("t", script.body, lambda e: None, backoff=Backoff(0.1, 0.5),
                          clock=lambda: script.now, sleep=script.sleep)
    task.start()
    await script.blocked.wait()
    assert script.pauses == [0.1, 0.1, 0.1]
    await task.stop()


@pytest.mark.anyio
async def test_stop_cancels_a_running_body_without_counting_a_restart() -> None:
    script = Script(failures=0)
    task = SupervisedTask("t", script.body, lambda e: None, sleep=script.sleep)
    task.start()
    task.start()  # idempotent
    await script.blocked.wait()
    await task.stop()
    assert task.restarts == 0 and script.runs == 1 and not task.running


# --- decoding: any msgpack decodes or raises EventDecodeError ------------------------------------
def array(items: list[bytes]) -> bytes:
    return bytes([0x90 | len(items)]) + b"".join(items)


def map_(pairs: list[tuple[bytes, bytes]]) -> bytes:
    """A msgpack map from packed keys and values: its keys may be arrays or maps, which Python's
    msgpack.packb cannot write (a dict key cannot be a list) but a peer can send."""
    return bytes([0x80 | len(pairs)]) + b"".join(k + v for k, v in pairs)


WORDS = ["BlockStored", "BlockRemoved", "AllBlocksCleared", "type", "ts", "events", "block_hashes",
         "parent_block_hash", "token_ids", "block_size", "extra_keys", "metadata", "cache_salt", "GPU"]
scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(),
                    st.binary(max_size=4), st.sampled_from(WORDS)).map(msgpack.packb)
packed = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=5).map(array),
    st.lists(st.tuples(inner, inner), max_size=4).map(map_)), max_leaves=16)
tag = st.sampled_from(["BlockStored", "BlockRemoved", "AllBlocksCleared"]).map(msgpack.packb)
events = st.one_of(
    packed,
    st.builds(lambda t, fields: array([t, *fields]), tag, st.lists(packed, max_size=8)),
    st.builds(lambda t, pairs: map_([(msgpack.packb("type"), t), *pairs]), tag,
              st.lists(st.tuples(st.one_of(st.sampled_from(WORDS).map(msgpack.packb), packed), packed), max_size=5)),
)
batches = st.one_of(
    packed,
    st.builds(lambda ts, evs: array([ts, array(evs)]), packed, st.lists(events, max_size=3)),
    st.builds(lambda ts, evs: map_([(msgpack.packb("ts"), ts), (msgpack.packb("events"), array(evs))]),
              packed, st.lists(events, max_size=3)),
)


@given(batches)
def test_any_msgpack_decodes_or_raises_decode_error(body: bytes) -> None:
    try:
        batch = decode_batch(body)
    except EventDecodeError:
        return
    assert isinstance(batch, VllmEventBatch)


ARRAY_KEY = map_([(array([msgpack.packb(1)]), msgpack.packb(2))])
"""{[1]: 2}: the payload that ended the ingest task."""


@pytest.mark.parametrize("body", [
    ARRAY_KEY,
    map_([(msgpack.packb("ts"), msgpack.packb(1.0)), (map_([]), msgpack.packb(0))]),
    array([msgpack.packb(1.0), array([map_([(msgpack.packb("type"), msgpack.packb("AllBlocksCleared")),
                                            (array([]), msgpack.packb(None))])])]),
], ids=["array key", "map key", "array key in an event"])
def test_a_map_key_that_is_an_array_or_a_map_is_a_decode_error(body: bytes) -> None:
    with pytest.raises(EventDecodeError, match="map key"):
        decode_batch(body)


# --- the ingest task ----------------------------------------------------------------------------
class Holdings:
    """What the subscriber feeds: batches seen (their ts) and forgets; `fail_on` makes on_batch raise."""

    def __init__(self, fail_on: float | None = None) -> None:
        self.seen: list[float] = []
        self.forgets = 0
        self.fail_on = fail_on

    def on_batch(self, batch: VllmEventBatch) -> None:
        if batch.ts == self.fail_on:
            self.fail_on = None
            raise RuntimeError("an event this engine version never sent")
        self.seen.append(batch.ts)

    def on_gap(self) -> None:
        self.forgets += 1


@contextlib.asynccontextmanager
async def following(holdings: Holdings) -> AsyncIterator[tuple[Engine, KVEventSubscriber]]:
    ctx = zmq.asyncio.Context()
    engine = Engine(ctx)
    sub = KVEventSubscriber(SubscriberConfig(f"tcp://127.0.0.1:{engine.pub_port}"), holdings.on_batch,
                            holdings.on_gap, context=ctx)
    await sub.start()
    try:
        await engine.wait_subscribed()
        yield engine, sub
    finally:
        await sub.stop()
        await engine.close()
        ctx.term()


def exposition(sub: KVEventSubscriber) -> str:
    return render_prometheus([ingest_stats(sub, EngineBlockMap(16))], {})


@pytest.mark.anyio
async def test_a_map_with_an_array_key_is_counted_and_dropped_and_the_stream_goes_on() -> None:
    holdings = Holdings()
    async with following(holdings) as (engine, sub):
        await engine.send(0, payload(0))
        await engine.send(1, ARRAY_KEY)
        await engine.pub.send_multipart((b"kv", b"\x00\x01"))  # not (topic, seq, payload)
        await engine.pub.send_multipart((b"kv", b"\x00", payload(9)))  # a seq that is not 8 bytes
        await engine.send(2, payload(2))
        await until(lambda: sub.last_seq == 2, "batch 2", timeout_s=FAIL_FAST_S)
        assert holdings.seen == [0, 2] and holdings.forgets == 1
        assert sub.stats.bad_payloads == 1 and sub.stats.malformed_messages == 2 and sub.task.restarts == 0
        text = exposition(sub)
        assert "radixmesh_kv_event_bad_payloads_total 1.0" in text
        assert "radixmesh_kv_event_malformed_messages_total 2.0" in text


@pytest.mark.anyio
async def test_an_unexpected_failure_restarts_the_ingest_task_and_forgets_the_engine_blocks() -> None:
    holdings = Holdings(fail_on=1)
    async with following(holdings) as (engine, sub):
        await engine.send(0, payload(0))
        await engine.send(1, payload(1))
        await until(lambda: sub.task.restarts == 1, "the ingest task to fail once", timeout_s=FAIL_FAST_S)
        assert holdings.forgets == 1 and sub.last_seq is None  # the next batch is taken as a first one
        await engine.send(2, payload(2))
        await until(lambda: sub.last_seq == 2, "batch 2 after the restart", timeout_s=FAIL_FAST_S)
        assert holdings.seen == [0, 2] and sub.task.running
        assert "radixmesh_kv_event_ingest_restarts_total 1.0" in exposition(sub)


# --- the index watch ----------------------------------------------------------------------------
class ScriptedWatch:
    """WatchIndex as the test scripts it: call i streams `streams[i]` and stays open; the second
    call waits for `resume` first, so the test sees the watcher between a failure and its snapshot."""

    def __init__(self, streams: list[list[IndexUpdate]]) -> None:
        self.streams = streams
        self.watches = 0
        self.resume = asyncio.Event()

    async def watch_index(self) -> AsyncIterator[IndexUpdate]:
        self.watches += 1
        if self.watches > 1:
            await self.resume.wait()
        for update in self.streams[self.watches - 1]:
            yield update
        await asyncio.Event().wait()


@pytest.mark.anyio
async def test_an_index_watch_that_fails_unexpectedly_is_out_of_sync_until_it_resyncs() -> None:
    snapshot, nxt = IndexUpdate(1, reset=True, incarnation="a"), IndexUpdate(2, incarnation="a")
    client = ScriptedWatch([[snapshot, nxt], [IndexUpdate(7, reset=True, incarnation="a")]])
    applied: list[int] = []

    def on_update(update: IndexUpdate) -> None:
        if update is nxt:
            raise KeyError("a router that cannot take this update")
        applied.append(update.seq)

    watcher = IndexWatcher(cast(MetadataClient, client), on_update=on_update)
    watcher.start()
    try:
        await until(lambda: client.watches == 2, "the watch to start again", timeout_s=FAIL_FAST_S)
        assert not watcher.replica.in_sync  # not frozen at update 2 while claiming to be in sync
        assert watcher.stats() == IndexWatchStats(index_watch_restarts=1, index_replica_in_sync=0)
        client.resume.set()
        await until(lambda: watcher.replica.in_sync, "the next snapshot", timeout_s=FAIL_FAST_S)
        assert watcher.replica.seq == 7 and applied == [1, 7] and watcher.snapshots == 2
        assert watcher.stats() == IndexWatchStats(index_watch_restarts=1, index_replica_in_sync=1)
        assert "radixmesh_index_watch_restarts_total 1.0" in render_prometheus([watcher.stats()], {})
    finally:
        await watcher.close()
    assert not watcher.replica.in_sync
