"""Where the router's prefix knowledge comes from: its index replica, else the metadata service's Match.

The replica answers while it is in sync (IndexWatcher); otherwise `Match` is asked with a short
deadline. Degraded mode: when Match fails or times out, there is no prefix knowledge (requests are
routed by the fallback policy) and the service is probed again after `metadata_retry_s`; the first
answer, from Match or a replica back in sync, resumes prefix routing. Both transitions are logged.
"""

import asyncio
import logging
from collections.abc import Callable

import grpc

from radixmesh.cluster.fleet.reports import why_failed
from radixmesh.cluster.router.config import RouterConfig
from radixmesh.cluster.router.index_watch import IndexWatcher
from radixmesh.cluster.router.metrics import RouterMetrics
from radixmesh.common.metadata.client import MetadataClient
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.metadata.messages import MatchQuery, MatchResult
from radixmesh.proto.serve.plan import ServePlan

logger = logging.getLogger(__name__)


class MatchSource:
    """The replica's or Match's answer for a prompt's hashes, and whether prefix knowledge is on.
    Use from one event loop."""

    def __init__(self, config: RouterConfig, metadata: MetadataClient | None, watcher: IndexWatcher | None,
                 metrics: RouterMetrics, clock: Callable[[], float], *, policy: str, fallback: str) -> None:
        """`metadata` None: no prefix knowledge for good. `policy` and `fallback` name the policies
        each mode routes by (for the logs); `metrics.metadata_available` follows the mode."""
        self.config = config
        self.metadata = metadata
        self.watcher = watcher
        self.metrics = metrics
        self._clock = clock
        self._policy = policy
        self._fallback = fallback
        self._down_since: float | None = None if metadata is not None else clock()
        self.metrics.metadata_available = metadata is not None
        self.replica_decisions = 0
        """Answers given by the replica (the rest asked Match or had no prefix knowledge)."""

    @property
    def available(self) -> bool:
        """False while requests are routed without prefix knowledge."""
        return self._down_since is None

    def replica_match(self, hashes: list[BlockHash]) -> MatchResult | None:
        """The replica's answer (holders only), or None while it is not in sync."""
        if self.watcher is None:
            return None
        self.watcher.start()
        replica = self.watcher.replica
        if not replica.in_sync:
            return None
        result = replica.match(self.config.layout, hashes)
        if self._down_since is not None:
            logger.info("index replica in sync: routing by %s", self._policy)
            self._down_since = None
            self.metrics.metadata_available = True
        self.replica_decisions += 1
        return result

    async def match(self, hashes: list[BlockHash], request: ServePlan) -> MatchResult | None:
        """Match's answer, or None while the service is (considered) unreachable."""
        if self.metadata is None:
            return None
        now = self._clock()
        if self._down_since is not None and now - self._down_since < self.config.metadata_retry_s:
            return None
        query = MatchQuery(self.config.layout, tuple(hashes), request.tenant, request.request_id,
                           include_all_nodes=True)
        try:
            async with asyncio.timeout(self.config.match_timeout_s):
                [result] = await self.metadata.match([query])
        except (grpc.aio.AioRpcError, TimeoutError) as e:
            if self._down_since is None:
                logger.warning("metadata service unreachable (%s): routing by %s until it answers",
                               why_failed(e), self._fallback)
                self.metrics.metadata_available = False
            self._down_since = now
            return None
        if self._down_since is not None:
            logger.info("metadata service answers again: routing by %s", self._policy)
            self._down_since = None
            self.metrics.metadata_available = True
        return result
