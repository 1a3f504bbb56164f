"""The router as a detached Ray actor: it creates (and so owns) the node agents, then serves the
Router's HTTP API on its own event loop.

Owning the agents keeps them alive after the `radixmesh up` driver exits (an actor lives as long
as its owner) and makes `down` one kill away. What survives a restart: nothing; Ray does not
restart this actor (max_restarts=0). Agent actors restart on their own (a new epoch, empty cache).
Idempotent calls: `start` (returns the same URL), `url`, `nodes`, `stop`. The HTTP server is the
router's one application (router.http_api), `POST /radixmesh/route` included.
"""

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import ray
from aiohttp import web

from radixmesh.cluster.launch.config import NAMESPACE, LauncherConfig
from radixmesh.cluster.router.agent_clients import RayAgentClient, StaticAgentDirectory
from radixmesh.cluster.router.http_api import start_http
from radixmesh.cluster.router.router import Router
from radixmesh.node_agent.actor import AgentPlacement, make_agent_actor
from radixmesh.proto.ids import NodeId
from radixmesh.proto.metadata.auth import CallerCredentials
from radixmesh.proto.metadata.client import MetadataClient
from radixmesh.proto.metadata.nodes import NodeInfo

logger = logging.getLogger(__name__)

ROUTER_ACTOR = "radixmesh-router"


def deployment_layout(infos: Sequence[NodeInfo]) -> tuple[str, int]:
    """The (layout fingerprint, KV bytes per block) that every agent in `infos` registered with.

    The bytes come from the agents (their KVLayout, dtype included), so the router prices a pull of
    a bf16 block at half a float32 one. ValueError when `infos` is empty or the agents disagree.
    """
    kinds = {(i.layout, i.block_bytes) for i in infos}
    if len(kinds) != 1:
        raise ValueError(f"agents of one deployment must share one KV layout and bytes per block, got {kinds}")
    return kinds.pop()


class RouterActor:
    """Creates the agents of `placements`, then runs a Router over them behind HTTP."""

    def __init__(self, config: LauncherConfig, metadata_address: str,
                 placements: Sequence[tuple[NodeId, str, AgentPlacement]]) -> None:
        """`placements`: (node id, address its transfer server binds, where its actor runs)."""
        self._config = config
        self._metadata_address = metadata_address
        self._placements = list(placements)
        self._router: Router | None = None
        self._runner: web.AppRunner | None = None
        self._url = ""
        self._lock = asyncio.Lock()

    async def start(self) -> str:
        """Start every agent (in parallel), then the router; the router's base URL."""
        async with self._lock:
            if self._router is None:
                await self._start()
        return self._url

    async def _start(self) -> None:
        cfg = self._config
        clients = [RayAgentClient(node, make_agent_actor(cfg.agent_config(node, self._metadata_address, host),
                                                         placement))
                   for node, host, placement in self._placements]
        infos = await asyncio.gather(*(c.start() for c in clients))
        layout, block_bytes = deployment_layout(infos)
        metadata = MetadataClient(self._metadata_address, credentials=CallerCredentials.cluster(cfg.secret),
                                  timeout_s=5.0)
        tokenizer, template = await asyncio.to_thread(lambda: (cfg.model.tokenizer(), cfg.model.chat_template()))
        router = Router(cfg.router_config(layout, block_bytes), StaticAgentDirectory(clients), metadata,
                        tokenizer=tokenizer, chat_template=template)
        runner, port = await start_http(router, cfg.host, cfg.http_port, api_key=cfg.api_key)
        self._runner, self._router = runner, router
        self._url = f"http://{cfg.host}:{port}"
        logger.info("router on %s over %d agent(s)", self._url, len(clients))

    def url(self) -> str:
        return self._url

    def nodes(self) -> list[NodeId]:
        return self._router.directory.nodes() if self._router is not None else []

    async def stop(self) -> None:
        """Stop HTTP; the agents go with this actor."""
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()


def make_router_actor(config: LauncherConfig, metadata_address: str,
                      placements: Sequence[tuple[NodeId, str, AgentPlacement]]) -> Any:
    """Create the detached router actor (named ROUTER_ACTOR); call `start` on the handle."""
    return ray.remote(RouterActor).options(
        name=ROUTER_ACTOR, namespace=NAMESPACE, lifetime="detached", num_cpus=0, max_restarts=0,
    ).remote(config, metadata_address, list(placements))
