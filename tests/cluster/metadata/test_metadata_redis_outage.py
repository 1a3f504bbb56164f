"""A Redis outage under the metadata service: no RPC waits on Redis or fails because of it, the
service serves from memory and says so, and once Redis answers again every counter increment is
stored exactly once, even the batch whose reply was lost (issue 15)."""

import asyncio
import os
import signal
import subprocess
from collections.abc import Iterator

import pytest

from radixmesh.cluster.metadata.service import MetadataService
from radixmesh.cluster.metadata.service_config import ServiceConfig
from radixmesh.cluster.metadata.store import RedisStore
from radixmesh.common.metadata.client import MetadataClient
from radixmesh.proto.ids import NodeId
from radixmesh.proto.metadata.hits import RequestHits
from radixmesh.proto.metadata.nodes import NodeInfo, NodeLoad
from radixmesh.proto.serve.tokens import TokenSources
from tests.support.poll import until
from tests.support.servers import redis_process, start_metadata_server

pytestmark = [pytest.mark.integration, pytest.mark.slow]
A = NodeId("a")


@pytest.fixture
def redis_proc() -> Iterator[tuple[subprocess.Popen[str], str]]:
    with redis_process() as (proc, url):
        try:
            yield proc, url
        finally:
            os.kill(proc.pid, signal.SIGCONT)  # a test that froze it: terminate needs it running


def hits(i: int) -> list[RequestHits]:
    return [RequestHits(f"q{i}", "t", TokenSources(local_gpu=16, computed=8))]


def test_a_frozen_redis_stalls_no_rpc_and_loses_or_doubles_no_count(
        redis_proc: tuple[subprocess.Popen[str], str]) -> None:
    proc, url = redis_proc
    store = RedisStore(url, socket_timeout_s=0.5, max_backoff_s=0.2)

    async def body() -> None:
        server, port = await start_metadata_server(MetadataService(store, ServiceConfig(lease_ttl_s=30)))
        try:
            async with MetadataClient(f"127.0.0.1:{port}", timeout_s=5.0) as client:
                await client.register(NodeInfo(A, 1, "L", 16, 8192, "addr", 100))
                for i in range(5):
                    await client.heartbeat(A, 1, NodeLoad(), hits(i))
                await until(lambda: store.pending() == 0, "the first writes to land")
                os.kill(proc.pid, signal.SIGSTOP)  # Redis hangs: connections open, no replies
                for i in range(5, 10):  # each would wait for, then fail on, a synchronous write
                    await client.heartbeat(A, 1, NodeLoad(), hits(i))
                await until(lambda: "unreachable" in store.describe(), "the writer to notice the outage")
                stats = await client.stats()
                assert "serving from memory" in stats.state_store and stats.hits.total.requests == 10
                os.kill(proc.pid, signal.SIGCONT)  # the writes it queued meanwhile now run, too
                await until(lambda: store.pending() == 0 and "unreachable" not in store.describe(),
                            "the writer to catch up")
        finally:
            await server.stop(None)

    asyncio.run(body())
    assert store.write_failures >= 1
    again = RedisStore(url)
    assert again.load_counters()["total"]["requests"] == 10  # the retried batch counted once
    assert set(again.load_nodes()) == {A} and again.load_index() is not None
    again.close()
