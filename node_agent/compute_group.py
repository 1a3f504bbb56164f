"""Which agents share compute: the `compute_group` an agent heartbeats (NodeLoad.compute_group), and
how much of it the agent computes on (`compute_share`).

Several agents on one machine run on the same cores unless they were pinned apart, and each
measures its prefill rate as if the cores were its own; the router prices agents of one group as
sharing them. The machine is named by the kernel's boot id (equal for containers on one kernel,
where host names differ), else the host name. `RADIXMESH_COMPUTE_GROUP`, when set, names the group
instead: containers on one kernel under CPU quotas of their own share a boot id but not cores, and
simulated hosts (network namespaces of one machine) stand for machines of their own.
"""

import hashlib
import os
import socket
from pathlib import Path

import torch

_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
ENV_VAR = "RADIXMESH_COMPUTE_GROUP"


def machine_id() -> str:
    try:
        return _BOOT_ID.read_text().strip()[:64] or socket.gethostname()
    except OSError:
        return socket.gethostname()


def compute_group(on: str | torch.device) -> str:
    """The machine plus what the engine computes on: its cpu set (agents pinned to other cores do not
    share), or the GPU's uuid (Ray renumbers visible GPUs from 0 in every actor)."""
    if named := os.environ.get(ENV_VAR, "").strip()[:128]:
        return named
    device = torch.device(on)
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return f"{machine_id()}/gpu-{props.uuid}"
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    listed = ",".join(map(str, cores))
    if len(listed) > 64:  # a many-core machine: the set's digest keeps the group within its limit
        listed = hashlib.sha256(listed.encode()).hexdigest()[:16]
    return f"{machine_id()}/cpu-{listed}"


def compute_share(on: str | torch.device) -> float:
    """The share of its group's cores the engine computes on: torch's threads over the CPUs this
    process may run on, or 1 on an accelerator (each agent on a GPU uses it whole, time-sliced).

    Agents whose busy shares add up to no more than 1 run side by side without slowing each other: two
    one-thread agents on a 2-core box are not sharing, and priced as if they were, the router's TTFT
    estimates came out 2x pessimistic whenever both were busy (realized / estimated 0.45-0.49 at p50
    past the knee, 0.84 with no sharing priced; docs/benchmarks.md).
    """
    if torch.device(on).type != "cpu":
        return 1.0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return min(1.0, torch.get_num_threads() / cores)
