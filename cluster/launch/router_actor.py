"""The router as a detached Ray actor: it creates (and so owns) the node agents, then serves the
Router's HTTP API on its own event loop. Agents follow the cluster: an AgentReconciler starts one
for every slot a joining node offers and drops those of nodes that left (reconcile.py).

Owning the agents keeps them alive after the `radixmesh up` driver exits (an actor lives as long
as its owner) and makes `down` one kill away. What survives a restart: nothing; Ray does not
restart this actor (max_restarts=0). Agent actors restart on their own (a new epoch, empty cache).
Idempotent calls: `start` (returns the same URL), `url`, `nodes`, `joined`, `failed`, `stop`. The HTTP server is the
router's one application (cluster/api/app.py), `POST /radixmesh/route` included.
"""

import asyncio
import logging
import secrets
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import ray
from aiohttp import web

from radixmesh.cluster.api.admin import AdminConfig, admin_key
from radixmesh.cluster.api.app import server_tls_pem, start_http
from radixmesh.cluster.fleet.agent_client import StaticAgentDirectory
from radixmesh.cluster.launch.config import NAMESPACE, LauncherConfig
from radixmesh.cluster.launch.reconcile import AgentReconciler, RayAgents
from radixmesh.cluster.launch.secret_file import NodeKey, NodeSecret, NodeTls, api_key_path
from radixmesh.cluster.launch.tls import scrape_ca
from radixmesh.cluster.observability.file_sd import TARGETS_FILE, FileSdConfig
from radixmesh.cluster.router.router import Router
from radixmesh.common.metadata.auth import CallerCredentials
from radixmesh.common.metadata.client import MetadataClient
from radixmesh.common.metrics.scrape import metrics_token
from radixmesh.common.secret import ClusterSecret
from radixmesh.proto.ids import NodeId
from radixmesh.proto.metadata.nodes import NodeInfo

logger = logging.getLogger(__name__)

ROUTER_ACTOR = "radixmesh-router"
RECONCILE_INTERVAL_S = 1.0
"""How often the agents are matched against the cluster's nodes (one GCS call per round)."""


def deployment_layout(infos: Sequence[NodeInfo]) -> tuple[str, int]:
    """The (layout fingerprint, KV bytes per block) that every agent in `infos` registered with.

    The bytes come from the agents (their KVLayout, dtype included), so the router prices a pull of
    a bf16 block at half a float32 one. ValueError when `infos` is empty or the agents disagree.
    """
    kinds = {(i.layout, i.block_bytes) for i in infos}
    if len(kinds) != 1:
        raise ValueError(f"agents of one deployment must share one KV layout and bytes per block, got {kinds}")
    return kinds.pop()


def one_layout(info: NodeInfo, others: list[NodeInfo]) -> None:
    """An agent may join a deployment only with the KV layout of the agents already in it."""
    deployment_layout([*others, info])


class RouterActor:
    """Starts the agents the cluster has slots for, then runs a Router over them behind HTTP while
    the agents follow the cluster."""

    def __init__(self, config: LauncherConfig, metadata_address: str, secret: NodeSecret, api_key: NodeKey | None,
                 tls: NodeTls | None) -> None:
        config = replace(config, secret=secret(), api_key=api_key() if api_key else "", tls=tls() if tls else None)
        self._config = config
        self._metadata_address = metadata_address
        agents = RayAgents(config, metadata_address)
        self._reconciler = AgentReconciler(agents.desired, agents.start, agents.stop, StaticAgentDirectory([]),
                                           accept=one_layout)
        self._joined: list[NodeInfo] = []  # what `up` prints while it waits for `start`
        self._reconciler.on_join = self._joined.append
        self._router: Router | None = None
        self._runner: web.AppRunner | None = None
        self._url = ""
        self._lock = asyncio.Lock()

    async def start(self) -> str:
        """Start the agents of every slot offered now (at least one), then the router; its base URL."""
        async with self._lock:
            if self._router is None:
                await self._start()
        return self._url

    async def _start(self) -> None:
        cfg = self._config
        await self._reconciler.until_any(RECONCILE_INTERVAL_S)
        layout, block_bytes = deployment_layout(list(self._reconciler.infos.values()))
        metadata = MetadataClient(self._metadata_address, credentials=CallerCredentials.cluster(cfg.secret),
                                  root_certificates=cfg.tls.trust if cfg.tls else None, timeout_s=5.0)
        tokenizer, template = await asyncio.to_thread(lambda: (cfg.model.tokenizer(), cfg.model.chat_template()))
        router = Router(cfg.router_config(layout, block_bytes), self._reconciler.directory, metadata)
        router.start()  # the replica syncs now, so the first request's hand-off knows its prefill agent's address
        tls = server_tls_pem(cfg.tls.cert_chain, cfg.tls.private_key) if cfg.tls else None
        # The CA is written even without TLS: deploy/prometheus.yml names the file either way.
        ca = scrape_ca(cfg.tls, cfg.secret)
        file_sd = (FileSdConfig(cfg.prometheus_dir / TARGETS_FILE, metrics_token=metrics_token(cfg.secret),
                                ca_certificate=ca)
                   if cfg.prometheus_dir is not None else None)
        runner, port = await start_http(router, cfg.host, cfg.http_port, tokenizer=tokenizer, chat_template=template,
                                        api_key=cfg.api_key, tls=tls,
                                        log_access=cfg.log_access, file_sd=file_sd,
                                        admin=AdminConfig(admin_key(cfg.secret)))
        self._runner, self._router = runner, router
        self._url = f"{'https' if tls else 'http'}://{cfg.host}:{port}"
        self._reconciler.follow(RECONCILE_INTERVAL_S)
        logger.debug("router on %s over %d agent(s)", self._url, len(router.directory.nodes()))

    def url(self) -> str:
        return self._url

    def joined(self) -> list[NodeInfo]:
        """Every agent that has joined so far, in order (callable while `start` runs)."""
        return list(self._joined)

    def failed(self) -> dict[NodeId, str]:
        """Why each node whose agent could not start failed (one line each), until it joins: `up` names
        them while it starts and once it serves without them (callable while `start` runs)."""
        return dict(self._reconciler.failures)

    def nodes(self) -> list[NodeId]:
        return self._router.directory.nodes() if self._router is not None else []

    async def stop(self) -> None:
        """Stop following the cluster, HTTP, then every agent (each stops before it is killed: its disk
        tier keeps what it had queued)."""
        await self._reconciler.close()
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
        await self._reconciler.stop_all()


def make_router_actor(config: LauncherConfig, metadata_address: str, node_ip: str) -> Any:
    """Create the detached router actor (named ROUTER_ACTOR) on the Ray node `node_ip` (the one whose
    address `config.host` is: this node, the driver's); call `start` on the handle. The actor loads
    the cluster secret, the API key and the TLS private key on its node: its arguments carry a fresh
    secret that opens nothing in the secret's place, and neither key (they are written 0600 under
    $RADIXMESH_HOME here, see secret_file.NodeKey)."""
    secret = NodeSecret.of(config.secret, config.secret_file)
    api_key = NodeKey.staged(api_key_path(), config.api_key, "the API key") if config.api_key else None
    tls = NodeTls.staged(config.tls) if config.tls else None
    return ray.remote(RouterActor).options(
        name=ROUTER_ACTOR, namespace=NAMESPACE, lifetime="detached", num_cpus=0, max_restarts=0,
        resources={f"node:{node_ip}": 0.001},
    ).remote(replace(config, secret=ClusterSecret.generate(), api_key=_stand_in(config.api_key), tls=None),
             metadata_address, secret, api_key, tls)


def _stand_in(api_key: str) -> str:
    """What the actor's arguments carry in the API key's place: a random key that opens nothing (the
    actor reads the real one from its node), never "", which LauncherConfig refuses beyond loopback."""
    return secrets.token_urlsafe(32) if api_key else ""
