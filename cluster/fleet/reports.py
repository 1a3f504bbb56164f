"""What /stats and /metrics read beyond the router's own counters: the metadata service's GetStats
and each agent's Prometheus text, each asked within a deadline so a slow part never stalls a scrape."""

import asyncio
import logging

import grpc

from radixmesh.cluster.fleet.agent_client import AgentClient, AgentDirectory, AgentUnavailable
from radixmesh.common.metadata.client import MetadataClient
from radixmesh.proto.ids import NodeId
from radixmesh.proto.metadata.messages import ClusterStats

logger = logging.getLogger(__name__)


async def cluster_stats(metadata: MetadataClient | None, timeout_s: float) -> ClusterStats | None:
    """The metadata service's GetStats, or None when there is none or it does not answer in time."""
    if metadata is None:
        return None
    try:
        async with asyncio.timeout(timeout_s):
            return await metadata.stats()
    except (grpc.aio.AioRpcError, TimeoutError) as e:
        logger.info("GetStats failed: %s", why_failed(e))
        return None


async def agent_metrics(directory: AgentDirectory, timeout_s: float, exclude: frozenset[NodeId] = frozenset()
                        ) -> dict[NodeId, str]:
    """Each reachable agent's Prometheus text (but those of `exclude`), asked all at once, each
    within `timeout_s`: an agent that fails or is slow is left out (and logged), and never delays
    the others."""
    nodes = [n for n in directory.nodes() if n not in exclude]
    clients = [c for c in map(directory.get, nodes) if c is not None]

    async def one(client: AgentClient) -> str | None:
        try:
            async with asyncio.timeout(timeout_s):
                return await client.prometheus_text()
        except (AgentUnavailable, TimeoutError) as e:
            logger.info("metrics of agent %s unavailable: %s", client.node, e)
            return None

    texts = await asyncio.gather(*(one(c) for c in clients))
    return {c.node: t for c, t in zip(clients, texts, strict=True) if t is not None}


def why_failed(e: BaseException) -> str:
    """One line for a failed or late metadata RPC."""
    if isinstance(e, grpc.aio.AioRpcError):
        return f"{e.code().name}: {e.details()}"
    return f"no answer in time ({type(e).__name__})"
