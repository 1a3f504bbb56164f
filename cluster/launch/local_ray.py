"""Ray on one machine, with every Ray process bound to 127.0.0.1.

On Linux Ray turns `_node_ip_address="127.0.0.1"` into the machine's routable address (it assumes a
multi-machine cluster), so its agents would listen on, and be reached at, that address. Ray keeps
loopback only when it believes it runs a single-machine cluster, which one environment variable says;
child processes read it from the environment, this process from the constant already imported.
"""

import os
from typing import Any

import ray
from ray._private import ray_constants

_SINGLE_MACHINE_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def init_loopback_ray(**kwargs: Any) -> None:
    """`ray.init` of a new local instance on 127.0.0.1 without the dashboard; kwargs go to ray.init."""
    os.environ[_SINGLE_MACHINE_ENV] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    ray.init(address="local", _node_ip_address="127.0.0.1", include_dashboard=False, **kwargs)
