"""Shared fixtures: a real redis-server per test (tests/support/servers.py), UCX reset per module, the
gpu marker's skip, the guard that no grpc.aio object outlives its event loop, and the xdist schedule
of the Ray modules (tests/support/xdist_schedule.py)."""

import sys
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from xdist.scheduler import LoadScopeScheduling

from tests.support import grpc_loops
from tests.support.servers import running_redis
from tests.support.xdist_schedule import RayTestsTogether

# Two cores are shared by the test process and the servers it starts; intra-op threads only contend.
torch.set_num_threads(1)
grpc_loops.track()
grpc_loops.drop_stale_completions()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> LoadScopeScheduling | None:
    """Under `-n N` (xdist's default `load` distribution): `RayTestsTogether`, which runs the Ray modules
    on one worker beside the other tests, and on both once only they are left."""
    return RayTestsTogether(config, log) if config.getvalue("dist") == "load" else None


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
            # lingers is a receive posted for a pull that failed (see ucx_transport.UcxChannel.chunks).
            warnings.warn(f"UCX context reset with objects still alive: {e}", stacklevel=1)


@pytest.fixture(autouse=True)
def grpc_closed_with_its_loop() -> Iterator[None]:
    """Fails the test that leaves a grpc.aio channel or server open past its event loop; left alone, the
    object's late completions error some later test's loop (tests/support/grpc_loops.py)."""
    yield
    left = grpc_loops.left_open()
    assert not left, f"open after the event loop it was made on closed: {', '.join(left)}; close it first"


@pytest.fixture
def redis_url() -> Iterator[str]:
    """A redis-server for one test."""
    with running_redis() as url:
        yield url
