"""How the router reaches node agents: one interface (AgentClient, AgentDirectory), whether the
agent is a Ray actor (RayAgentClient) or in this process (LocalAgentClient).

Every client honours AgentClient's contract: `serve` yields TokenDelta items then one ServeResult,
raises InvalidRequest for a refused plan and AgentUnavailable when the agent is gone. Clients of
radixmesh's own agents can also drop their cache (CacheResettable); an external engine's cannot.
"""

import contextlib
import logging
from collections.abc import AsyncGenerator, Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

import ray

from radixmesh.common.metrics.scrape import ScrapeTarget
from radixmesh.proto.ids import NodeId
from radixmesh.proto.metadata.nodes import NodeInfo
from radixmesh.proto.serve.limits import AgentBusy, InvalidRequest
from radixmesh.proto.serve.plan import ServeItem, ServePlan

logger = logging.getLogger(__name__)


class AgentUnavailable(Exception):
    """The agent died or cannot be reached; the request may be retried on another node."""


class AgentClient(Protocol):
    """A handle on one node agent.

    `serve` yields TokenDelta items as tokens are produced and ends with one ServeResult; closing the
    generator early (aclose) aborts the request and frees its blocks. It raises
    AgentUnavailable when the agent is gone (before or during the stream) and InvalidRequest when the
    agent refuses the request as invalid; nothing else.
    """

    @property
    def node(self) -> NodeId:
        """Which agent this is (fixed for the client's life: read-only, so a frozen dataclass fits)."""
        ...

    def serve(self, plan: ServePlan) -> AsyncGenerator[ServeItem, None]: ...

    async def prometheus_text(self) -> str:
        """The agent's metrics (memory of both tiers, engine, transfer) in Prometheus text format."""
        ...

    async def scrape_target(self) -> ScrapeTarget | None:
        """Where Prometheus scrapes the agent itself; None when it serves no /metrics of its own (the
        router's /metrics then carries its metrics alone)."""
        ...


@runtime_checkable
class CacheResettable(Protocol):
    """A client whose agent can drop its prefix cache (the router's POST /reset_prefix_cache)."""

    async def reset_prefix_cache(self) -> dict[str, int]:
        """Drop every cached block nothing holds, on every tier, and publish the removals before
        returning; blocks in use or pinned by a peer's pull stay. Returns the blocks dropped per tier.
        Raises AgentBusy (nothing dropped) while a request runs on the agent, AgentUnavailable when
        the agent is gone."""
        ...


class AgentDirectory(Protocol):
    """Which agents exist right now, and the role each registered with (the launcher keeps it current)."""

    def get(self, node: NodeId) -> AgentClient | None: ...

    def nodes(self) -> list[NodeId]: ...

    def role(self, node: NodeId) -> str:
        """`node`'s role (proto.metadata.nodes.NODE_ROLES; "both" for one not known)."""
        ...


class ServingAgent(Protocol):
    """What LocalAgentClient needs of an agent in this process (node_agent's NodeAgent is one); typed
    here so the router never imports node_agent."""

    node: NodeId

    def serve(self, plan: ServePlan) -> AsyncGenerator[ServeItem, None]: ...

    async def prometheus_text(self) -> str: ...

    def scrape_target(self) -> ScrapeTarget | None: ...

    async def reset_prefix_cache(self) -> dict[str, int]: ...


class LocalAgentClient:
    """A NodeAgent in this process (tests, single-process demos)."""

    def __init__(self, agent: ServingAgent) -> None:
        self.agent = agent
        self.node: NodeId = agent.node

    async def serve(self, plan: ServePlan) -> AsyncGenerator[ServeItem, None]:
        try:
            # aclosing: closing this stream closes the agent's now, which aborts the request at once
            async with contextlib.aclosing(self.agent.serve(plan)) as items:
                async for item in items:
                    yield item
        except (InvalidRequest, AgentBusy):
            raise
        except Exception as e:  # a stopped or broken agent: the router retries elsewhere
            raise AgentUnavailable(f"agent {self.node}: {e}") from e

    async def prometheus_text(self) -> str:
        try:
            return await self.agent.prometheus_text()
        except RuntimeError as e:
            raise AgentUnavailable(f"agent {self.node}: {e}") from e

    async def scrape_target(self) -> ScrapeTarget | None:
        return self.agent.scrape_target()

    async def reset_prefix_cache(self) -> dict[str, int]:
        try:
            return await self.agent.reset_prefix_cache()
        except RuntimeError as e:  # not started, or stopped
            raise AgentUnavailable(f"agent {self.node}: {e}") from e


class StaticAgentDirectory:
    """A fixed set of agent clients; `remove` takes one out (the launcher saw it die). `roles`: the
    role each agent registered with (NodeInfo.role), "both" for those it does not name."""

    def __init__(self, clients: Iterable[AgentClient], roles: Mapping[NodeId, str] | None = None) -> None:
        self._clients: dict[NodeId, AgentClient] = {c.node: c for c in clients}
        self._roles: dict[NodeId, str] = dict(roles or {})

    def get(self, node: NodeId) -> AgentClient | None:
        return self._clients.get(node)

    def nodes(self) -> list[NodeId]:
        return sorted(self._clients)

    def role(self, node: NodeId) -> str:
        return self._roles.get(node, "both")

    def add(self, client: AgentClient, role: str = "both") -> None:
        self._clients[client.node] = client
        self._roles[client.node] = role

    def remove(self, node: NodeId) -> None:
        self._clients.pop(node, None)
        self._roles.pop(node, None)


class RayAgentClient:
    """An agent actor (node_agent.actor.make_agent_actor) through its handle."""

    def __init__(self, node: NodeId, handle: Any) -> None:
        self.node = node
        self.handle = handle

    async def serve(self, plan: ServePlan) -> AsyncGenerator[ServeItem, None]:
        try:
            stream = self.handle.serve.options(num_returns="streaming").remote(plan)
            async for ref in stream:
                yield await ref
        except ray.exceptions.RayTaskError as e:
            match e.cause:
                case InvalidRequest() as refused:  # the agent refused the plan: the caller's error
                    raise InvalidRequest(str(refused)) from None
                case AgentBusy() as busy:
                    raise AgentBusy(str(busy)) from None
                case cause:
                    raise AgentUnavailable(f"agent {self.node} failed: {cause!r}") from e
        except ray.exceptions.RayError as e:  # actor died, or is unreachable
            raise AgentUnavailable(f"agent {self.node}: {e}") from e

    async def start(self) -> NodeInfo:
        """Wait until the agent runs (through a restart, too: start is idempotent, so Ray may retry
        it); its registration record."""
        try:
            info: NodeInfo = await self.handle.start.options(max_task_retries=-1).remote()
        except ray.exceptions.RayError as e:
            raise AgentUnavailable(f"agent {self.node}: {e}") from e
        return info

    async def prometheus_text(self) -> str:
        try:
            text: str = await self.handle.prometheus_text.options(max_task_retries=-1).remote()
        except ray.exceptions.RayError as e:
            raise AgentUnavailable(f"agent {self.node}: {e}") from e
        return text

    async def scrape_target(self) -> ScrapeTarget | None:
        try:
            target: ScrapeTarget | None = await self.handle.scrape_target.options(max_task_retries=-1).remote()
        except ray.exceptions.RayError as e:
            raise AgentUnavailable(f"agent {self.node}: {e}") from e
        return target

    async def reset_prefix_cache(self) -> dict[str, int]:
        try:
            dropped: dict[str, int] = await self.handle.reset_prefix_cache.options(max_task_retries=-1).remote()
        except ray.exceptions.RayTaskError as e:
            if isinstance(e.cause, AgentBusy):
                raise AgentBusy(str(e.cause)) from None
            raise AgentUnavailable(f"agent {self.node} failed: {e.cause!r}") from e
        except ray.exceptions.RayError as e:
            raise AgentUnavailable(f"agent {self.node}: {e}") from e
        return dropped
