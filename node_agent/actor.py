"""The node agent as a Ray actor: a thin shell over NodeAgent, made by one factory that holds placement
and restart options.

What survives a restart: only the AgentConfig the actor was created with (and where it loads the cluster
secret on its node: make_agent_actor keeps the secret out of the arguments). Ray re-runs the constructor
on restart; the next call starts a new NodeAgent with an empty cache and a new, strictly higher epoch
(time-based), which registers again, so the metadata service drops every block of the old epoch.
Requests in flight when the actor died fail with RayActorError (the client says AgentUnavailable) and
are not retried by Ray (max_task_retries=0): the router retries them elsewhere, with care for tokens
already streamed.

Idempotent calls: `start`, `stop`, `node_info`, `load`, `prometheus_text`, `scrape_target`,
`check_invariants`, `reset_prefix_cache` (a second reset finds nothing more to drop), and `pull` (a peer's pull under transfer="ray": it only reads cached blocks; its
pins end with the stream).
`serve` is not: each call runs the request once (a retry must use a new request id or another node).
"""

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import ray

from radixmesh.common.metrics.scrape import ScrapeTarget
from radixmesh.common.secret import ClusterSecret
from radixmesh.node_agent.config import AgentConfig
from radixmesh.node_agent.transfer.ucx_env import ucx_env
from radixmesh.proto.ids import NodeId, agent_actor_name
from radixmesh.proto.metadata.nodes import NodeInfo, NodeLoad
from radixmesh.proto.serve.plan import ServeItem, ServePlan

if TYPE_CHECKING:
    from radixmesh.node_agent.agent import NodeAgent


def node_resource(node: NodeId) -> str:
    """The custom resource that pins a simulated node's agent to its Ray node (one machine, tests)."""
    return f"radixmesh-node-{node}"


@dataclass(frozen=True, slots=True)
class AgentPlacement:
    """Where an agent actor runs and how Ray restarts it."""

    num_gpus: float = 0.0
    """1 on a GPU cluster: one agent per GPU."""
    resources: tuple[tuple[str, float], ...] = ()
    """Custom resources, e.g. ((node_resource(node), 1),) for a simulated node."""
    max_restarts: int = -1
    """-1: restart for ever (each restart is a new epoch with an empty cache)."""
    num_cpus: float = 1.0
    env_vars: tuple[tuple[str, str], ...] = ()
    """Extra environment of the actor's process (e.g. ucx_env(loopback=True) items)."""

    @classmethod
    def gpu(cls) -> "AgentPlacement":
        return cls(num_gpus=1.0)

    @classmethod
    def simulated(cls, node: NodeId, *, loopback: bool = True) -> "AgentPlacement":
        # Set in the actor's environment, not by its import_ucxx: the agent's transport is made without
        # knowing it runs on one machine, and Ray's env_vars reach the process before ucxx loads.
        env = tuple(ucx_env(loopback=True).items()) if loopback else ()
        return cls(resources=((node_resource(node), 1.0),), env_vars=env)


class AgentActor:
    """The actor body: every method awaits, none blocks its event loop (engine steps run on the
    agent's own thread)."""

    def __init__(self, config: AgentConfig, secret: Callable[[], ClusterSecret] | None = None) -> None:
        self._config = config if secret is None else keyed(config, secret())
        self._agent: NodeAgent | None = None
        self._starting = asyncio.Lock()

    async def start(self) -> NodeInfo:
        """Start the agent if it is not running; its registration record."""
        async with self._starting:
            if self._agent is None:
                # Imported in the actor's own process: the router and `up`, which create agent actors,
                # never load torch and the engine.
                from radixmesh.node_agent.agent import NodeAgent

                agent = NodeAgent(self._config if self._config.zone else replace(self._config, zone=_ray_zone()))
                await agent.start()
                self._agent = agent
        return self._agent.node_info()

    async def serve(self, plan: ServePlan) -> AsyncIterator[ServeItem]:
        """Stream the plan's TokenDelta items and its ServeResult (call with num_returns="streaming")."""
        await self.start()
        assert self._agent is not None
        async for item in self._agent.serve(plan):
            yield item

    async def pull(self, request: bytes) -> AsyncIterator[Any]:
        """A peer's pull under the Ray transport (transfer.ray_transport.serve_pull's stream; call with
        num_returns="streaming"). The owner's pins last exactly as long as the stream."""
        await self.start()
        assert self._agent is not None
        async for item in self._agent.serve_pull(request):
            yield item

    async def node_info(self) -> NodeInfo:
        return await self.start()

    async def load(self) -> NodeLoad:
        await self.start()
        assert self._agent is not None
        return await self._agent.load()

    async def prometheus_text(self) -> str:
        await self.start()
        assert self._agent is not None
        return await self._agent.prometheus_text()

    async def scrape_target(self) -> ScrapeTarget | None:
        """Where Prometheus scrapes this agent (None: no /metrics of its own)."""
        await self.start()
        assert self._agent is not None
        return self._agent.scrape_target()

    async def reset_prefix_cache(self) -> dict[str, int]:
        """Drop the cached blocks nothing holds (NodeAgent.reset_prefix_cache); AgentBusy while a
        request runs here."""
        await self.start()
        assert self._agent is not None
        return await self._agent.reset_prefix_cache()

    async def check_invariants(self) -> None:
        await self.start()
        assert self._agent is not None
        await self._agent.check_invariants()

    async def stop(self) -> None:
        async with self._starting:
            if self._agent is not None:
                await self._agent.stop()
                self._agent = None


def _ray_zone() -> str:
    """The availability zone Ray labels this actor's node with ("" when it has none: no cloud)."""
    return str(ray.get_runtime_context().get_node_labels().get("ray.io/availability-zone", ""))


def keyed(config: AgentConfig, secret: ClusterSecret) -> AgentConfig:
    """`config` with `secret` and the block-hash key derived from it."""
    memory = replace(config.engine.memory, hash_key=secret.hash_key())
    return replace(config, secret=secret, engine=replace(config.engine, memory=memory))


def make_agent_actor(config: AgentConfig, placement: AgentPlacement,
                     secret: Callable[[], ClusterSecret] | None = None) -> Any:
    """Create `config.node_id`'s agent actor under agent_actor_name(node); returns its handle. The
    agent starts on the first call (call `start` to wait for it).

    With `secret` (a picklable loader, e.g. launch.secret_file.NodeSecret) the actor loads the cluster
    secret on its node, at every (re)start, and its arguments carry neither `config.secret` nor the
    block-hash key: Ray keeps them in its GCS, readable by anyone who reaches Ray. Without, `config`
    travels whole (tests, benches on one machine)."""
    if secret is not None:
        # A fresh secret that opens nothing (and its hash key) stands in until the actor loads the real one.
        config = keyed(config, ClusterSecret.generate())
    cls = ray.remote(AgentActor)
    return cls.options(
        name=agent_actor_name(config.node_id),
        num_cpus=placement.num_cpus,
        num_gpus=placement.num_gpus,
        resources=dict(placement.resources),
        max_restarts=placement.max_restarts,
        max_task_retries=0,  # serve is not idempotent: the router decides about retries
        runtime_env={"env_vars": dict(placement.env_vars)} if placement.env_vars else None,
    ).remote(config, secret)
