"""The metadata service as a detached Ray actor: the gRPC server runs on the actor's event loop.

What survives: the state store. `stop` drains calls and persists the index to the store; a later
`start` builds a fresh MetadataService on the same store (with Redis it answers Match at once from
the persisted snapshot; with memory it starts empty) and binds the same port, so agents and the
router reconnect without being told. `start`, `stop` and `address` are idempotent. Ray does not
restart this actor (max_restarts=0): a crashed service is brought back by `radixmesh up`.

With `leader_lease` (a Redis state store) the actor serves only while it holds the leader key in
that Redis (cluster/metadata/leader.py): `up --metadata-standby` makes two, the active and a
standby that takes over within ~1 s of the active dying. An active that loses the key stops serving
and waits to be leader again, so the pair keeps one standby after a takeover.
"""

import asyncio
import logging
import socket
from typing import Any

import ray

from radixmesh.cluster.launch.config import NAMESPACE
from radixmesh.cluster.launch.secret_file import NodeSecret, NodeTls
from radixmesh.cluster.metadata.leader import LeaderLease, serve_while_leader
from radixmesh.cluster.metadata.server import (
    MetadataServer,
    ServerOptions,
    TlsFiles,
    create_server,
    tune_gc_for_serving,
)
from radixmesh.cluster.metadata.service import MetadataService
from radixmesh.cluster.metadata.service_config import ServiceConfig
from radixmesh.cluster.metadata.store import open_store
from radixmesh.common.secret import ClusterSecret

logger = logging.getLogger(__name__)

METADATA_ACTOR = "radixmesh-metadata"
METADATA_STANDBY_ACTOR = "radixmesh-metadata-standby"


class MetadataActor:
    """Hosts one MetadataServer at a time on host:port (port 0 picks one at the first start, or at
    once with `leader_lease`: clients list a standby's address before it serves)."""

    def __init__(self, host: str, port: int, state: str, lease_ttl_s: float, secret: ClusterSecret | NodeSecret,
                 tls: NodeTls | None, leader_lease: bool = False, leader_ttl_s: float = 1.0) -> None:
        self._host = host
        self._secret = secret if isinstance(secret, ClusterSecret) else secret()
        self._tls = tls() if tls else None
        self._port = port if port or not leader_lease else _free_port(host)
        self._state = state
        self._config = ServiceConfig(lease_ttl_s=lease_ttl_s)
        self._server: MetadataServer | None = None
        self._leader_lease = leader_lease
        self._leader_ttl_s = leader_ttl_s
        self._leading: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._serving = asyncio.Event()

    async def start(self, wait: bool = True) -> str:
        """Serve (if not serving); the service's host:port. With `leader_lease`, start contending for
        the leader key and, if `wait`, return once this one serves. Raises ValueError for a bad state
        URL, RuntimeError when the port cannot be bound."""
        if not self._leader_lease:
            if self._server is None:
                self._server = await self._start_server()
            return self.address()
        if self._leading is None:
            self._stop.clear()
            self._leading = asyncio.create_task(self._lead(), name="metadata-leader")
        if wait:
            serving = asyncio.create_task(self._serving.wait())
            await asyncio.wait({serving, self._leading}, return_when=asyncio.FIRST_COMPLETED)
            serving.cancel()
            if self._leading.done():
                leading, self._leading = self._leading, None
                leading.result()  # raises what ended it
        return self.address()

    async def _start_server(self) -> MetadataServer:
        store = open_store(self._state)
        server, bound = create_server(MetadataService(store, self._config),
                                      ServerOptions(host=self._host, port=self._port, secret=self._secret,
                                                    tls=self._tls))
        if bound == 0:
            store.close()
            raise RuntimeError(f"metadata service could not bind {self._host}:{self._port}")
        await server.start()
        tune_gc_for_serving()  # this Ray worker process serves only the metadata service
        self._port = bound  # a restart binds the same port again
        logger.debug("metadata service on %s:%d (state: %s)", self._host, bound, store.describe())
        return server

    async def _lead(self) -> None:
        async def start() -> MetadataServer:
            self._server = await self._start_server()
            self._serving.set()
            return self._server

        lease = LeaderLease(self._state, self.address(), ttl_s=self._leader_ttl_s)
        try:
            while not await serve_while_leader(lease, start, self._stop):
                self._server = None
                self._serving.clear()
                logger.warning("metadata service %s lost the leader key: standing by", self.address())
        finally:
            self._server = None
            self._serving.clear()
            await lease.close()

    async def stop(self, grace_s: float = 1.0) -> None:
        """Stop serving; in-flight calls get `grace_s` to finish, the index is persisted (and the
        leader key released: a standby takes over at once)."""
        if self._leading is not None:
            # Never cancel `_lead`: a cancel that lands while the server starts left that server
            # listening and the key held for a ttl. `_stop` ends the wait for the key as well.
            leading, self._leading = self._leading, None
            self._stop.set()
            await leading
        elif self._server is not None:
            server, self._server = self._server, None
            await server.stop(grace_s)

    def address(self) -> str:
        return f"{self._host}:{self._port}"

    def serving(self) -> bool:
        return self._server is not None


def _free_port(host: str) -> int:
    """A port free on `host` now. It may be taken before the standby binds it; the standby then
    fails to serve (logged), which `radixmesh up` with a fixed --metadata-port avoids."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def failover_target(addresses: list[str]) -> str:
    """One gRPC target for an active and a standby "ip:port" (`ipv4:h:p1,h:p2`, see leader.py); the
    launcher binds both to the IPv4 address of one Ray node."""
    return addresses[0] if len(addresses) == 1 else f"ipv4:{','.join(addresses)}"


def make_metadata_actor(host: str, port: int, state: str, lease_ttl_s: float, secret: ClusterSecret | NodeSecret,
                        node_ip: str, tls: TlsFiles | None = None, *, name: str = METADATA_ACTOR,
                        leader_lease: bool = False, leader_ttl_s: float = 1.0) -> Any:
    """Create the detached metadata actor `name` on the Ray node `node_ip` (the one whose address
    `host` is); call `start` on the handle. `leader_ttl_s` is the leader key's ttl (with
    `leader_lease`): how long a standby waits after the active died without releasing it. The
    launcher passes a NodeSecret (the actor loads the secret on its node); a ClusterSecret travels
    in the actor's arguments, for tests. `tls`'s private key never does: it is written 0600 under
    $RADIXMESH_HOME here, on `node_ip` (the driver's node), and the actor loads it (NodeTls)."""
    return ray.remote(MetadataActor).options(
        name=name, namespace=NAMESPACE, lifetime="detached", num_cpus=0, max_restarts=0,
        resources={f"node:{node_ip}": 0.001},
    ).remote(host, port, state, lease_ttl_s, secret, NodeTls.staged(tls) if tls else None, leader_lease,
             leader_ttl_s)
