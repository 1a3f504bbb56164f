"""Where an agent publishes its KV events, and the rule for binding beyond this machine.

vLLM's ZMQ event sockets carry no authentication: anyone who reaches them reads which prefixes the
agent caches (the prompts' block hashes and token ids). So, secure by default, an agent binds them
only where this machine alone reaches: a loopback tcp:// address or an ipc:// path. Any other address
(a LAN address, 0.0.0.0, *) needs `allow_remote` (`--kv-events-allow-remote`), said explicitly by
whoever also firewalls the port.

The replay socket sits next to the PUB socket: tcp port + 1 (port 0: both pick a free port), or the
ipc path + ".replay".
"""

from radixmesh.common.secret import is_loopback


def check_endpoint(endpoint: str, *, allow_remote: bool = False) -> None:
    """ValueError, naming what is valid, unless `endpoint` is an address the agent may publish on."""
    scheme, sep, rest = endpoint.partition("://")
    if not sep or scheme not in ("tcp", "ipc") or not rest:
        raise ValueError(f"KV events endpoint must be tcp://host:port or ipc://path, got {endpoint!r}")
    if scheme == "ipc":
        return
    host, port = _host_port(endpoint, rest)
    if not 0 <= port < 65535:
        raise ValueError(f"KV events port must be in [0, 65534] (the replay socket takes port + 1), got {port}")
    if not allow_remote and not is_loopback(host):
        raise ValueError(f"KV events endpoint {endpoint!r} is not a loopback address: vLLM's event sockets "
                         "carry no authentication, so binding beyond this machine needs --kv-events-allow-remote")


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
