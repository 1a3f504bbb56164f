"""A metadata service that serves only while it holds the leader key: the active or the standby.

`serve_as_leader` is what `radixmesh metadata-server --leader-lease` and the launcher's metadata
actors run. `python -m radixmesh.cluster.metadata.leader_server` runs it as a bare process (the
failover test and bench/failover.py kill one with SIGKILL): it imports no torch, so it is up in
~2 s on the shared 2-core box where the CLI takes ~18 s. It prints one line per state change
("waiting ...", "serving ...") so a parent can wait for it without sleeping.
"""

import argparse
import asyncio
import os
import signal
from collections.abc import Callable

from radixmesh.cluster.metadata.leader import LeaderLease, serve_while_leader
from radixmesh.cluster.metadata.server import MetadataServer, ServerOptions, create_server
from radixmesh.cluster.metadata.service import MetadataService
from radixmesh.cluster.metadata.service_config import ServiceConfig
from radixmesh.cluster.metadata.store import open_store
from radixmesh.common.secret import ClusterSecret

SECRET_ENV = "RADIXMESH_SECRET"


async def serve_as_leader(
    state: str,
    options: ServerOptions,
    lease_ttl_s: float,
    stop: asyncio.Event,
    *,
    leader_ttl_s: float = 1.0,
    say: Callable[[str], None] = lambda _: None,
) -> bool:
    """Wait for the leader key in the Redis at `state`, then build the service from that Redis (what
    the last leader left) and serve on `options` until `stop` (True: the key is released) or until
    the key is lost (False). `options.port` must be fixed (not 0): clients list it before it binds.
    RuntimeError when the port cannot be bound."""
    if options.port == 0:
        raise ValueError("a leader-lease server needs a fixed port: clients list it before it serves")
    lease = LeaderLease(state, f"{options.host}:{options.port}", ttl_s=leader_ttl_s)
    say(f"metadata-server on {options.host}:{options.port} waiting for the leader key")

    async def start() -> MetadataServer:
        service = MetadataService(open_store(state), ServiceConfig(lease_ttl_s=lease_ttl_s))
        server, bound = create_server(service, options)
        if bound == 0:
            service.close()
            raise RuntimeError(f"could not bind {options.host}:{options.port}")
        await server.start()
        say(f"metadata-server serving on {options.host}:{bound} (leader; state: {service.store.describe()})")
        return server

    try:
        return await serve_while_leader(lease, start, stop)
    finally:
        await lease.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--state", required=True, help="redis:// URL of the shared state")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--lease-ttl", type=float, default=10.0, help="node lease, seconds")
    ap.add_argument("--leader-ttl", type=float, default=1.0, help="leader key ttl, seconds")
    args = ap.parse_args()
    text = os.environ.get(SECRET_ENV)
    secret = ClusterSecret.from_hex(text) if text else None
    options = ServerOptions(host=args.host, port=args.port, secret=secret)

    async def run() -> None:
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        if not await serve_as_leader(args.state, options, args.lease_ttl, stop, leader_ttl_s=args.leader_ttl,
                                     say=lambda line: print(line, flush=True)):
            raise SystemExit("lost the leader key: stopped serving")

    asyncio.run(run())


if __name__ == "__main__":
    main()
