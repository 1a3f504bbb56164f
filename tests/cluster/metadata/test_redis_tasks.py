"""Stopping tasks that talk to Redis: a cancel that redis-py swallows (a command's timeout turns it
into redis' TimeoutError and withdraws it) must not leave the state-store writer, and with it a
metadata server's stop, waiting for ever (the hang behind two CI timeouts)."""

import asyncio

import redis.exceptions

from radixmesh.cluster.metadata.server import cancel_and_wait
from radixmesh.cluster.metadata.service import MetadataService
from radixmesh.cluster.metadata.store import RedisStore
from tests.support.servers import start_metadata_server


class SwallowingStore(RedisStore):
    """A Redis store whose first flush is cut short by a cancel the way redis-py reports it when the
    cancel meets a command timing out: TimeoutError, and the cancel request withdrawn."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.flushing = asyncio.Event()
        self.swallowed = 0

    async def flush(self) -> None:
        if self.swallowed:
            return await super().flush()
        self._dirty.clear()
        self.flushing.set()
        try:
            await asyncio.Event().wait()  # a command in flight
        except asyncio.CancelledError:
            task = asyncio.current_task()
            assert task is not None
            task.uncancel()
            self.swallowed += 1
            raise redis.exceptions.TimeoutError("Timeout reading from socket") from None


def test_a_swallowed_cancel_leaves_the_writer_running_and_cancel_and_wait_ends_it(redis_url: str) -> None:
    async def body() -> None:
        store = SwallowingStore(redis_url)
        writer = asyncio.create_task(store.write_behind())
        store.save_node("a", b"record")
        await store.flushing.wait()
        writer.cancel()
        done, _ = await asyncio.wait({writer}, timeout=0.5)
        assert not done and store.swallowed == 1  # one cancel was not enough: the writer goes on
        await cancel_and_wait(writer)
        assert writer.cancelled()
        store.close()

    asyncio.run(body())


def test_a_metadata_server_stops_although_its_writer_swallowed_the_cancel(redis_url: str) -> None:
    async def body() -> None:
        store = SwallowingStore(redis_url)
        server, _ = await start_metadata_server(MetadataService(store))
        store.save_node("a", b"record")
        await store.flushing.wait()
        await asyncio.wait_for(server.stop(0), 10.0)  # hung for ever before cancel_and_wait
        assert store.swallowed == 1
        assert RedisStore(redis_url).load_nodes() == {"a": b"record"}  # written at close

    asyncio.run(body())


def test_cancel_and_wait_returns_for_finished_failed_and_plain_tasks() -> None:
    async def body() -> None:
        async def fails() -> None:
            raise ValueError("dropped")

        finished = asyncio.create_task(asyncio.sleep(0))
        failed = asyncio.create_task(fails())
        sleeping = asyncio.create_task(asyncio.sleep(3600))
        await asyncio.wait({finished, failed})
        await cancel_and_wait(finished, failed, sleeping)
        assert finished.done() and not finished.cancelled()
        assert failed.done() and isinstance(failed.exception(), ValueError)
        assert sleeping.cancelled()
        await cancel_and_wait()  # nothing to stop

    asyncio.run(body())
