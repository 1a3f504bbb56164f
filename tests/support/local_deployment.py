"""Launcher deployments in a test module: the module's local Ray, and each deployment taken down when
its block ends (asserting that it went down), so a failed test leaves no actors for the next."""

import contextlib
from collections.abc import AsyncIterator, Iterator

import ray

from radixmesh.cluster.launch import launcher
from radixmesh.cluster.launch.config import LauncherConfig


def module_ray(config: LauncherConfig) -> Iterator[None]:
    """The body of a module-scoped fixture: a local Ray for `config` until the module ends."""
    launcher.init_local_ray(config)
    yield
    ray.shutdown()


@contextlib.asynccontextmanager
async def deployed(config: LauncherConfig) -> AsyncIterator[launcher.Deployment]:
    deployment = await launcher.up(config)
    try:
        yield deployment
    finally:
        assert await launcher.down()
