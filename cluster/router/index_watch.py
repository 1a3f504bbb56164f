"""IndexWatcher: keeps the router's IndexReplica in step with the metadata service's WatchIndex.

One task per router: watch, apply every update, and on a gap, a broken stream or a stopping service
forget the replica (the router then falls back to the Match RPC, then to least-loaded) and watch
again after `retry_s`, which starts with a fresh snapshot.
"""

import asyncio
import contextlib
import logging
from collections.abc import Callable

import grpc

from radixmesh.cluster.metadata.replica import IndexReplica, ReplicaGap
from radixmesh.common.metadata.client import MetadataClient
from radixmesh.proto.metadata.messages import IndexUpdate

logger = logging.getLogger(__name__)


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
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start watching on the running loop; idempotent."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="index-watch")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
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
