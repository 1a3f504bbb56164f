"""IndexWatcher: keeps the router's IndexReplica in step with the metadata service's WatchIndex.

One task per router: watch, apply every update, and on a gap, a broken stream or a stopping service
forget the replica (the router then falls back to the Match RPC, then to least-loaded) and watch
again after `retry_s`, which starts with a fresh snapshot. Anything else that goes wrong (an update
that does not apply for a reason nobody foresaw, an `on_update` that raises) restarts the task after
a backoff (SupervisedTask); the replica is forgotten first, so until the next snapshot it says it is
out of sync rather than answer from a copy that stopped following.
"""

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from radixmesh.cluster.fleet.supervised_task import SupervisedTask
from radixmesh.cluster.metadata.replica import IndexReplica, ReplicaGap
from radixmesh.common.metadata.client import MetadataClient
from radixmesh.common.metrics.exposition import metric
from radixmesh.proto.metadata.messages import IndexUpdate

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class IndexWatchStats:
    """How following the index goes, as radixmesh metrics (common/metrics/exposition.py)."""

    index_watch_restarts: int = metric("counter", "Unexpected failures of the index watch, each followed by "
                                                  "a restart (the replica forgotten until the next snapshot)")
    index_replica_in_sync: int = metric("gauge", "1 while the router's index replica follows the metadata "
                                                 "service, 0 while it waits for a snapshot")


class IndexWatcher:
    """Feeds `replica` from `client`'s WatchIndex stream until `close`. Use from one event loop."""

    def __init__(
        self,
        client: MetadataClient,
        replica: IndexReplica | None = None,
        *,
        retry_s: float = 0.5,
        on_update: Callable[[IndexUpdate], None] | None = None,
    ) -> None:
        """`on_update` is called after each update is applied (the benchmark times replica lag)."""
        self.client = client
        self.replica = replica or IndexReplica()
        self.retry_s = retry_s
        self.on_update = on_update
        self.snapshots = 0
        """Reset snapshots applied (the first one included)."""
        self.task = SupervisedTask("index-watch", self._run, self._restart)

    def start(self) -> None:
        """Start watching on the running loop; idempotent."""
        self.task.start()

    async def close(self) -> None:
        await self.task.stop()
        self.replica.desync()

    def stats(self) -> IndexWatchStats:
        return IndexWatchStats(self.task.restarts, int(self.replica.in_sync))

    def _restart(self, error: Exception) -> None:
        self.replica.desync()

    async def _run(self) -> None:
        while True:
            try:
                async for update in self.client.watch_index():
                    self.replica.apply(update)
                    if update.reset:
                        self.snapshots += 1
                        logger.info("index replica in sync at update %d (%d nodes, %d blocks)",
                                    update.seq, len(update.nodes), len(self.replica.index))
                    if self.on_update is not None:
                        self.on_update(update)
                logger.info("index watch ended by the metadata service; watching again")
            except ReplicaGap as e:
                logger.warning("index replica out of sync (%s): watching again for a snapshot", e)
                continue
            except grpc.aio.AioRpcError as e:
                logger.info("index watch failed (%s): Match RPC until it is back", e.code().name)
            self.replica.desync()
            await asyncio.sleep(self.retry_s)  # a pause before reconnecting, not a synchronisation
