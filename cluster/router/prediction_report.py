"""PredictionReporter: sends the predictions a router made on its index replica to the metadata
service's hit accounting (ReportPredictions), off the routing path.

`add` never waits: predictions are buffered and one task sends whatever has gathered while the
previous report was in flight, so reports batch themselves under load and go out at once when idle.
A report that fails is dropped (logged): hit accounting then lacks those predictions, as it lacks
those of Match calls that failed, and routing is unaffected.
"""

import asyncio
import contextlib
import logging

import grpc

from radixmesh.common.metadata.client import MetadataClient
from radixmesh.proto.metadata.messages import MatchPrediction

logger = logging.getLogger(__name__)


class PredictionReporter:
    def __init__(
        self, client: MetadataClient, router_id: str = "", max_batch: int = 1024, max_buffered: int = 65536
    ) -> None:
        self._client = client
        self._router_id = router_id
        self._max_batch = max_batch
        self._max_buffered = max_buffered
        self._buffer: list[MatchPrediction] = []
        self._task: asyncio.Task[None] | None = None
        self.sent = 0
        self.dropped = 0

    def add(self, prediction: MatchPrediction) -> None:
        if len(self._buffer) >= self._max_buffered:
            self.dropped += 1  # the service is unreachable for long: keep memory bounded
            return
        self._buffer.append(prediction)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._send(), name="prediction-report")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _send(self) -> None:
        while self._buffer:
            batch, self._buffer = self._buffer[: self._max_batch], self._buffer[self._max_batch :]
            try:
                await self._client.report_predictions(batch, self._router_id)
                self.sent += len(batch)
            except (grpc.aio.AioRpcError, TimeoutError) as e:
                self.dropped += len(batch)
                logger.info("%d prediction(s) not reported: %s", len(batch), e)
