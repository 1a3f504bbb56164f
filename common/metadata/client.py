"""Async client of the metadata service, for node agents and the router.

It speaks radixmesh's dataclasses; protobuf stays inside proto/metadata/codec.py. Errors arrive as
grpc.aio.AioRpcError with the service's status codes (see cluster/metadata/server.py). One client holds one
channel; share it between tasks of one event loop.
"""

import asyncio
from collections.abc import AsyncIterator, Iterable, Sequence
from types import TracebackType
from typing import Self

import grpc

from radixmesh.common.metadata.auth import NO_CREDENTIALS, CallerCredentials
from radixmesh.proto import radixmesh_pb2 as pb
from radixmesh.proto import radixmesh_pb2_grpc as pb_grpc
from radixmesh.proto.ids import NodeId
from radixmesh.proto.metadata import codec
from radixmesh.proto.metadata.hits import RequestHits
from radixmesh.proto.metadata.messages import (
    ClusterStats,
    EventBatch,
    IndexUpdate,
    MatchPrediction,
    MatchQuery,
    MatchResult,
    NodeSnapshot,
    PublishAck,
)
from radixmesh.proto.metadata.nodes import Lease, NodeInfo, NodeLoad


class MetadataClient:
    """Calls MetadataService at `target` ("host:port")."""

    def __init__(
        self,
        target: str,
        *,
        credentials: CallerCredentials = NO_CREDENTIALS,
        root_certificates: bytes | None = None,
        max_message_bytes: int = 16 << 20,
        timeout_s: float | None = 10.0,
    ) -> None:
        """`root_certificates` (PEM) switches to TLS; `credentials` are sent with every call. `target`
        may list an active and a standby service (`ipv4:h:p1,h:p2`): calls go to whichever listens."""
        options: list[tuple[str, int | str]] = [
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            # Reconnect within ~0.1 s, not gRPC's default 1 s then doubling: a standby service
            # (a second address in `target`) must be found within its 2 s takeover. The cap matters
            # as much: with 1 s, a client that failed for the ~1 s the standby waits out the dead
            # active's key found it up to 0.7 s after it served (bench/failover.py).
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 250),
        ]
        if root_certificates is None:
            self._channel = grpc.aio.insecure_channel(target, options=options)
        else:
            creds = grpc.ssl_channel_credentials(root_certificates)
            if target.startswith(("ipv4:", "ipv6:")):  # an address list: verify the certificate against its first host
                first = target.split(":", 1)[1].split(",")[0]
                options.append(("grpc.ssl_target_name_override", first.rsplit(":", 1)[0].strip("[]")))
            self._channel = grpc.aio.secure_channel(target, creds, options=options)
        self._stub = pb_grpc.MetadataServiceStub(self._channel)
        self._metadata = credentials.metadata
        self._timeout_s = timeout_s

    async def register(self, info: NodeInfo) -> Lease:
        reply = await self._stub.RegisterNode(codec.node_info_to_pb(info), **self._call_kwargs())
        return codec.lease_from_pb(reply)

    async def heartbeat(self, node: NodeId, epoch: int, load: NodeLoad, hits: Sequence[RequestHits] = ()) -> Lease:
        request = codec.heartbeat_to_pb(node, epoch, load, hits)
        return codec.lease_from_pb(await self._stub.Heartbeat(request, **self._call_kwargs()))

    async def publish(self, batches: Iterable[EventBatch]) -> PublishAck:
        """Stream `batches` in order on one call; RESYNC means send `sync_snapshot` next."""
        call = self._stub.PublishEvents(**self._call_kwargs())
        try:
            for b in batches:
                await call.write(codec.batch_to_pb(b))
            await call.done_writing()
        except (asyncio.InvalidStateError, grpc.aio.AioRpcError):
            pass  # the server answered early (RESYNC or an error): awaiting the call says which
        return codec.ack_from_pb(await call)

    async def sync_snapshot(self, snapshot: NodeSnapshot) -> PublishAck:
        reply = await self._stub.SyncSnapshot(codec.snapshot_to_pb(snapshot), **self._call_kwargs())
        return codec.ack_from_pb(reply)

    async def match(self, queries: Sequence[MatchQuery]) -> list[MatchResult]:
        reply = await self._stub.Match(codec.match_request_to_pb(queries), **self._call_kwargs())
        return codec.match_response_from_pb(reply)

    async def watch_index(self) -> AsyncIterator[IndexUpdate]:
        """The service's WatchIndex stream: a reset snapshot, then every change in order. It has no
        deadline (it lasts as long as the service); it ends with the AioRpcError that broke it."""
        call = self._stub.WatchIndex(pb.WatchIndexRequest(), metadata=self._metadata)
        try:
            async for m in call:
                yield codec.update_from_pb(m)
        finally:
            call.cancel()

    async def report_predictions(self, predictions: Sequence[MatchPrediction], router_id: str = "") -> None:
        request = codec.predictions_to_pb(predictions, router_id)
        await self._stub.ReportPredictions(request, **self._call_kwargs())

    async def stats(self) -> ClusterStats:
        return codec.stats_from_pb(await self._stub.GetStats(pb.GetStatsRequest(), **self._call_kwargs()))

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def _call_kwargs(self) -> dict[str, object]:
        return {"metadata": self._metadata, "timeout": self._timeout_s}
