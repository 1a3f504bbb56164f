"""How the router reaches node agents: one interface, whether the agent is a Ray actor or in-process."""

from collections.abc import AsyncGenerator
from typing import Protocol

from radixmesh.node_agent.metrics_server import ScrapeTarget
from radixmesh.proto.ids import NodeId
from radixmesh.proto.serve.plan import ServeItem, ServePlan


class AgentUnavailable(Exception):
    """The agent died or cannot be reached; the request may be retried on another node."""


class AgentClient(Protocol):
    """A handle on one node agent.

    `serve` yields TokenDelta items as tokens are produced and ends with one ServeResult; closing the
    generator early (aclose) aborts the request and frees its blocks. It raises
    AgentUnavailable when the agent is gone (before or during the stream) and InvalidRequest when the
    agent refuses the request as invalid; nothing else.
    """

    node: NodeId

    def serve(self, plan: ServePlan) -> AsyncGenerator[ServeItem, None]: ...

    async def prometheus_text(self) -> str:
        """The agent's metrics (memory of both tiers, engine, transfer) in Prometheus text format."""
        ...

    async def scrape_target(self) -> ScrapeTarget | None:
        """Where Prometheus scrapes the agent itself; None when it serves no /metrics of its own (the
        router's /metrics then carries its metrics alone)."""
        ...


class AgentDirectory(Protocol):
    """Which agents exist right now (the launcher keeps it current)."""

    def get(self, node: NodeId) -> AgentClient | None: ...

    def nodes(self) -> list[NodeId]: ...
