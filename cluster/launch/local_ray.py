"""Ray on one machine, with every Ray process bound to 127.0.0.1.

On Linux Ray turns `_node_ip_address="127.0.0.1"` into the machine's routable address (it assumes a
multi-machine cluster), so its agents would listen on, and be reached at, that address. Ray keeps
loopback only when it believes it runs a single-machine cluster, which one environment variable says;
child processes read it from the environment, this process from the constant already imported.
"""

import glob
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psutil
import ray
from ray._private import ray_constants

_SINGLE_MACHINE_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
# Ray waits 30 s for the GCS to write its port file. In CI the suite's GCS twice never did, without
# writing a line of log; the one more try below started in 9 s. 60 s leaves a slow start on a loaded
# 2-core machine its time, unless the user set their own.
_GCS_PORT_WAIT_ENV = "RAY_gcs_server_port_wait_time_s"
_GCS_PORT_WAIT_S = "60"

log = logging.getLogger(__name__)


_RAYLET_TIMEOUT = "timed out during startup"
"""The message of Ray's exception for a raylet that did not register with the GCS in time."""


def loopback_environment(env: Mapping[str, str]) -> dict[str, str]:
    """What to add to `env` so that every Ray process started with it binds 127.0.0.1 and waits
    for a slow GCS (the user's own wait, when `env` sets one, stays): for this process, or for a Ray
    started in a subprocess."""
    return {_SINGLE_MACHINE_ENV: "0", _GCS_PORT_WAIT_ENV: env.get(_GCS_PORT_WAIT_ENV, _GCS_PORT_WAIT_S)}


def init_loopback_ray(**kwargs: Any) -> None:
    """`ray.init` of a new local instance on 127.0.0.1 without the dashboard; kwargs go to ray.init.

    A head that fails to start is stopped (what it started is killed: a failed `ray.init` keeps no
    handle on it) and started once more; a second failure raises with the GCS log's tail.
    """
    os.environ.update(loopback_environment(os.environ))
    ray_constants.ENABLE_RAY_CLUSTER = False
    if ray.is_initialized():
        raise RuntimeError("Ray is already initialized in this process; call ray.shutdown() first")
    for last_try in (False, True):
        before = {child.pid for child in psutil.Process().children(recursive=True)}
        try:
            ray.init(address="local", _node_ip_address="127.0.0.1", include_dashboard=False, **kwargs)
            return
        except Exception as exc:
            # Ray raises a plain Exception when its raylet does not register within a fixed 30 s
            # (node.py): on a busy 2-core box that is load, not a broken install, so it gets the retry too.
            if not (isinstance(exc, RuntimeError) or _RAYLET_TIMEOUT in str(exc)):
                raise
            tail = _gcs_log_tail()
            ray.shutdown()
            _kill_children_started_since(before)
            if last_try:
                raise RuntimeError(f"Ray's head did not start: {exc}\n{tail}") from exc
            log.warning("Ray's head did not start (%s); trying once more\n%s", exc, tail)


def _kill_children_started_since(before: set[int]) -> None:
    new = [child for child in psutil.Process().children(recursive=True) if child.pid not in before]
    for child in new:
        child.kill()
    psutil.wait_procs(new, timeout=10)


def _gcs_log_tail(lines: int = 20) -> str:
    """The end of the newest session's GCS logs: why the GCS is slow or gone is written there."""
    sessions = sorted(glob.glob("/tmp/ray/session_2*"), key=os.path.getmtime)
    if not sessions:
        return "(no Ray session directory)"
    tails = []
    for name in ("gcs_server.err", "gcs_server.out"):
        path = Path(sessions[-1], "logs", name)
        if path.is_file():
            text = path.read_text(errors="replace").splitlines()[-lines:]
            tails.append(f"--- {path}\n" + "\n".join(text))
    return "\n".join(tails) or f"(no GCS log under {sessions[-1]}/logs)"
