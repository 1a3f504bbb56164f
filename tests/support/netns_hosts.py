"""Hosts made of Linux network namespaces, for multi-host tests on one machine.

    root namespace: bridge <prefix>br, 198.18.0.254/24 (so the test reaches every host)
       |-- veth <prefix>v0 <-> eth0 in namespace <prefix>0: 198.18.0.1   (host 0)
       |-- veth <prefix>v1 <-> eth0 in namespace <prefix>1: 198.18.0.2   (host 1) ...

Addresses come from 198.18.0.0/24 (RFC 2544's benchmarking range) and exist only inside these
namespaces and on the bridge; no host has a default route, so nothing leaves them. Each host runs an
sshd in its own PID and mount namespace: `ray stop` there sees only that host's processes, and the
host's /tmp is its own (Ray's session files), while the home directory is one shared folder (an NFS
home, as on many clusters: Ray's auth token and the synced checkout are seen by every host).

Every process a host runs is found by `ip netns pids`, so `kill_processes` and `close` stop exactly
what the test started, never anything matched by name. `close` is safe to call at any point.
"""

import contextlib
import ipaddress
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Self

SUBNET = ipaddress.ip_network("198.18.0.0/24")
BRIDGE_ADDRESS = "198.18.0.254"


@dataclass(frozen=True, slots=True)
class Host:
    index: int
    netns: str
    address: str
    veth: str
    """The root-namespace end of the host's link: down partitions the host, up heals it."""


def ip(*args: str) -> str:
    return subprocess.run(["ip", *args], check=True, capture_output=True, text=True).stdout


def netns_pids(netns: str) -> list[int]:
    try:
        return [int(p) for p in ip("netns", "pids", netns).split()]
    except subprocess.CalledProcessError:  # the namespace is gone
        return []


def kill_netns_processes(netns: str, timeout_s: float = 10.0) -> None:
    """SIGKILL every process in network namespace `netns`, until none is left."""
    deadline = time.monotonic() + timeout_s
    while pids := netns_pids(netns):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise TimeoutError(f"processes {pids} of {netns} survive SIGKILL")
        time.sleep(0.05)  # polling the kernel's view of the namespace: there is nothing to wait on


class HostNetwork:
    """A bridge and the hosts attached to it; a context manager that removes everything on exit."""

    def __init__(self, prefix: str) -> None:
        assert len(prefix) <= 8, "interface names are limited to 15 characters"
        self.prefix = prefix
        self.bridge = f"{prefix}br"
        self.hosts: list[Host] = []
        ip("link", "add", self.bridge, "type", "bridge")
        ip("addr", "add", f"{BRIDGE_ADDRESS}/{SUBNET.prefixlen}", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add_host(self) -> Host:
        index = len(self.hosts)
        host = Host(index, f"{self.prefix}{index}", str(SUBNET[index + 1]), f"{self.prefix}v{index}")
        self.hosts.append(host)  # before creating anything: close() removes what exists of it
        ip("netns", "add", host.netns)
        ip("link", "add", host.veth, "type", "veth", "peer", "name", "eth0", "netns", host.netns)
        ip("link", "set", host.veth, "master", self.bridge, "up")
        ip("-n", host.netns, "addr", "add", f"{host.address}/{SUBNET.prefixlen}", "dev", "eth0")
        ip("-n", host.netns, "link", "set", "eth0", "up")
        ip("-n", host.netns, "link", "set", "lo", "up")
        return host

    def popen(self, host: Host, argv: list[str], **kwargs: object) -> subprocess.Popen[bytes]:
        """Start `argv` inside `host`'s network namespace."""
        return subprocess.Popen(["ip", "netns", "exec", host.netns, *argv], **kwargs)  # type: ignore[call-overload]

    def run(self, host: Host, argv: list[str]) -> str:
        """Run `argv` in `host`'s network namespace; its stdout."""
        return subprocess.run(["ip", "netns", "exec", host.netns, *argv], check=True, capture_output=True,
                              text=True).stdout

    def kill_processes(self, host: Host) -> None:
        """SIGKILL every process in `host` (a host that dies), until none is left."""
        kill_netns_processes(host.netns)

    def partition(self, host: Host) -> None:
        ip("link", "set", host.veth, "down")

    def heal(self, host: Host) -> None:
        ip("link", "set", host.veth, "up")

    def close(self) -> None:
        for host in reversed(self.hosts):
            self.kill_processes(host)
            with contextlib.suppress(subprocess.CalledProcessError):
                ip("link", "del", host.veth)
            with contextlib.suppress(subprocess.CalledProcessError):
                ip("netns", "del", host.netns)
        self.hosts = []
        with contextlib.suppress(subprocess.CalledProcessError):
            ip("link", "del", self.bridge)


def listening_sockets(network: HostNetwork, host: Host) -> list[tuple[str, str, str, int]]:
    """(protocol, local address:port, process name, pid) of every listening TCP/UDP socket in `host`."""
    out = []
    for line in network.run(host, ["ss", "-H", "-l", "-t", "-u", "-n", "-p"]).splitlines():
        fields = line.split()
        proto, local = fields[0], fields[4]
        users = fields[6] if len(fields) > 6 else ""
        name = users.split('"')[1] if '"' in users else "?"
        pid = int(users.split("pid=")[1].split(",")[0]) if "pid=" in users else 0
        out.append((proto, local, name, pid))
    return out


def sweep_leftovers(family: str) -> list[str]:
    """Remove the namespaces and links whose names start with `family` (left by a run that was
    killed before its cleanup): their processes first, by `ip netns pids`. Call only while no other
    run of the family can be alive (under the multi-host lock). The names removed."""
    removed = []
    for line in ip("netns", "list").splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith(family):
            kill_netns_processes(name)
            ip("netns", "del", name)
            removed.append(name)
    for line in ip("-o", "link", "show").splitlines():
        link = line.split(":")[1].strip().split("@")[0]
        if link.startswith(family):
            with contextlib.suppress(subprocess.CalledProcessError):  # a veth goes with its peer
                ip("link", "del", link)
            removed.append(link)
    return removed

