"""Where an agent publishes its KV events, and the rule for binding beyond this machine.

vLLM's ZMQ event sockets carry no authentication: anyone who reaches them reads which prefixes the
agent caches (the prompts' block hashes and token ids). An agent's tcp sockets are CURVE servers that
admit only holders of the cluster secret (common.kv_events_curve); still, secure by default, it binds
them only where this machine alone reaches: a loopback tcp:// address or an ipc:// path in a directory of
this user that nobody else may enter (0700: the socket file's permissions alone are not checked by
every platform). Abstract ipc sockets (`ipc://@name`) have no file and so no permissions: refused.
Any other address (a LAN address, 0.0.0.0, *) needs `allow_remote` (`--kv-events-allow-remote`),
said explicitly by whoever also firewalls the port. A loopback tcp address is open to every local
user: use an ipc path on a shared host.

The replay socket sits next to the PUB socket: tcp port + 1 (port 0: both pick a free port), or the
ipc path + ".replay".
"""

import os
import stat
from pathlib import Path

from radixmesh.common.secret import is_loopback


def check_endpoint(endpoint: str, *, allow_remote: bool = False) -> None:
    """ValueError, naming what is valid, unless `endpoint` is an address the agent may publish on."""
    scheme, sep, rest = endpoint.partition("://")
    if not sep or scheme not in ("tcp", "ipc") or not rest:
        raise ValueError(f"KV events endpoint must be tcp://host:port or ipc://path, got {endpoint!r}")
    if scheme == "ipc":
        _check_ipc_path(endpoint, rest)
        return
    host, port = _host_port(endpoint, rest)
    if not 0 <= port < 65535:
        raise ValueError(f"KV events port must be in [0, 65534] (the replay socket takes port + 1), got {port}")
    if not allow_remote and not is_loopback(host):
        raise ValueError(f"KV events endpoint {endpoint!r} is not a loopback address: vLLM's event sockets "
                         "carry no authentication, so binding beyond this machine needs --kv-events-allow-remote")


def _check_ipc_path(endpoint: str, path: str) -> None:
    if path.startswith("@"):
        raise ValueError(f"KV events endpoint {endpoint!r} is an abstract socket: it has no file permissions, so "
                         "any local process could read the events; give an ipc path in a 0700 directory")


def check_ipc_directory(endpoint: str) -> None:
    """ValueError unless an ipc `endpoint`'s directory is this user's, mode 0700 (tcp: nothing to check).
    Checked where the socket is bound (the agent's host), not where the config is written."""
    scheme, _, path = endpoint.partition("://")
    if scheme != "ipc":
        return
    folder = Path(path).parent
    try:
        st = os.stat(folder)
    except OSError as e:
        raise ValueError(f"KV events endpoint {endpoint!r}: its directory {str(folder)!r} cannot be used: {e}") from None
    if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o077:
        raise ValueError(f"KV events endpoint {endpoint!r}: its directory {str(folder)!r} must be this user's with "
                         f"mode 0700 (it is {stat.S_IMODE(st.st_mode):o}, owner uid {st.st_uid}): other users "
                         "could otherwise connect and read the events")


def replay_endpoint(endpoint: str) -> str:
    """The replay ROUTER's address beside the PUB `endpoint` (the module docstring)."""
    scheme, _, rest = endpoint.partition("://")
    if scheme == "ipc":
        return f"{endpoint}.replay"
    host, port = _host_port(endpoint, rest)
    bracketed = f"[{host}]" if ":" in host else host
    return f"tcp://{bracketed}:{port + 1 if port else 0}"


def _host_port(endpoint: str, rest: str) -> tuple[str, int]:
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"KV events endpoint must be tcp://host:port, got {endpoint!r}")
    return host.removeprefix("[").removesuffix("]"), int(port)
