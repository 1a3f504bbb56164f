"""The metadata service as a detached Ray actor: the gRPC server runs on the actor's event loop.

What survives: the state store. `stop` drains calls and persists the index to the store; a later
`start` builds a fresh MetadataService on the same store (with Redis it answers Match at once from
the persisted snapshot; with memory it starts empty) and binds the same port, so agents and the
router reconnect without being told. `start`, `stop` and `address` are idempotent. Ray does not
restart this actor (max_restarts=0): a crashed service is brought back by `radixmesh up`.
"""

import logging
from typing import Any

import ray

from radixmesh.cluster.launch.config import NAMESPACE
from radixmesh.cluster.metadata.server import (
    MetadataServer,
    ServerOptions,
    TlsFiles,
    create_server,
    tune_gc_for_serving,
)
from radixmesh.cluster.metadata.service import MetadataService, ServiceConfig
from radixmesh.cluster.metadata.store import open_store
from radixmesh.proto.cluster_secret import ClusterSecret

logger = logging.getLogger(__name__)

METADATA_ACTOR = "radixmesh-metadata"


class MetadataActor:
    """Hosts one MetadataServer at a time on host:port (port 0 picks one at the first start)."""

    def __init__(self, host: str, port: int, state: str, lease_ttl_s: float, secret: ClusterSecret,
                 tls: TlsFiles | None) -> None:
        self._host = host
        self._secret = secret
        self._tls = tls
        self._port = port
        self._state = state
        self._config = ServiceConfig(lease_ttl_s=lease_ttl_s)
        self._server: MetadataServer | None = None

    async def start(self) -> str:
        """Serve (if not serving); the service's host:port. Raises ValueError for a bad state URL,
        RuntimeError when the port cannot be bound."""
        if self._server is None:
            store = open_store(self._state)
            server, bound = create_server(MetadataService(store, self._config),
                                          ServerOptions(host=self._host, port=self._port, secret=self._secret,
                                                        tls=self._tls))
            if bound == 0:
                store.close()
                raise RuntimeError(f"metadata service could not bind {self._host}:{self._port}")
            await server.start()
            tune_gc_for_serving()  # this Ray worker process serves only the metadata service
            self._server, self._port = server, bound  # a restart binds the same port again
            logger.info("metadata service on %s:%d (state: %s)", self._host, bound, store.describe())
        return self.address()

    async def stop(self, grace_s: float = 1.0) -> None:
        """Stop serving; in-flight calls get `grace_s` to finish, the index is persisted."""
        if self._server is not None:
            server, self._server = self._server, None
            await server.stop(grace_s)

    def address(self) -> str:
        return f"{self._host}:{self._port}"

    def serving(self) -> bool:
        return self._server is not None


def make_metadata_actor(host: str, port: int, state: str, lease_ttl_s: float, secret: ClusterSecret,
                        node_ip: str, tls: TlsFiles | None = None) -> Any:
    """Create the detached metadata actor (named METADATA_ACTOR) on the Ray node `node_ip` (the
    one whose address `host` is); call `start` on the handle."""
    return ray.remote(MetadataActor).options(
        name=METADATA_ACTOR, namespace=NAMESPACE, lifetime="detached", num_cpus=0, max_restarts=0,
        resources={f"node:{node_ip}": 0.001},
    ).remote(host, port, state, lease_ttl_s, secret, tls)
