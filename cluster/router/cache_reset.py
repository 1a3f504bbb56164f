"""Prefix-cache reset across the fleet: every agent drops its cached blocks, concurrently.

Each agent publishes the removals before it answers, so the index drops them too; one that refuses
(requests of another router run on it) or fails is reported, the others still reset. The router
refuses (RequestsRunning) or waits while requests run on it (Router.reset_prefix_cache).
"""

import asyncio
import logging
from dataclasses import dataclass

from radixmesh.cluster.fleet.agent_client import AgentDirectory, AgentUnavailable, CacheResettable
from radixmesh.proto.ids import NodeId
from radixmesh.proto.serve.limits import AgentBusy

logger = logging.getLogger(__name__)


class RequestsRunning(Exception):
    """A prefix-cache reset was refused, nothing dropped: requests are running on this router."""


@dataclass(frozen=True, slots=True)
class CacheReset:
    """What a prefix-cache reset did on each agent."""

    dropped: dict[NodeId, dict[str, int]]
    """Per node that reset: the cached blocks it dropped, per tier."""
    busy: dict[NodeId, str]
    """Per node that refused because requests run on it (another router's): why."""
    failed: dict[NodeId, str]
    """Per node that could not be reset (gone, or an engine that cannot drop its cache): why."""


async def reset_agents(directory: AgentDirectory) -> CacheReset:
    """Reset every agent of `directory` concurrently (CacheResettable) and say what each did."""
    nodes = directory.nodes()
    outcomes = await asyncio.gather(*(_reset_agent(directory, n) for n in nodes))
    reset = CacheReset({n: o for n, o in zip(nodes, outcomes, strict=True) if isinstance(o, dict)},
                       {n: str(o) for n, o in zip(nodes, outcomes, strict=True) if isinstance(o, AgentBusy)},
                       {n: o for n, o in zip(nodes, outcomes, strict=True) if isinstance(o, str)})
    logger.info("prefix cache reset: %d node(s) dropped %d cached block(s); busy %s, failed %s",
                len(reset.dropped), sum(sum(d.values()) for d in reset.dropped.values()),
                sorted(reset.busy) or "none", sorted(reset.failed) or "none")
    return reset


async def _reset_agent(directory: AgentDirectory, node: NodeId) -> dict[str, int] | AgentBusy | str:
    """One agent's reset: what it dropped, its refusal, or why it could not be reset."""
    client = directory.get(node)
    if client is None:
        return "the agent left"
    if not isinstance(client, CacheResettable):
        return "its engine cannot drop its cache through radixmesh"
    try:
        return await client.reset_prefix_cache()
    except AgentBusy as e:
        return e
    except AgentUnavailable as e:
        return str(e)
