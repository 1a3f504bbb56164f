"""Which network interface holds an address: run on a node (as a Ray task) to hold UCX to the
interface of the agent's address. Standard library only, so the task's process imports nothing else."""

import fcntl
import socket
import struct

SIOCGIFADDR = 0x8915
"""ioctl: an interface's IPv4 address, at bytes 20..24 of the returned ifreq."""


def interface_of(address: str) -> str | None:
    """The name of this machine's network interface whose IPv4 address is `address`, or None."""
    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                ifreq = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address on this interface
                continue
        if socket.inet_ntoa(ifreq[20:24]) == address:
            return name
    return None
