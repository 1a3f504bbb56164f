"""The gRPC face of MetadataService: a thin grpc.aio servicer, caller authentication, message size
limits, TLS and the standard health service.

Each RPC converts (proto/metadata/codec.py), calls the plain service object and maps its typed errors to
status codes: LimitExceeded -> RESOURCE_EXHAUSTED, ValueError -> INVALID_ARGUMENT, StaleEpoch ->
FAILED_PRECONDITION, UnknownNode -> NOT_FOUND. A call without a valid credential is refused with
UNAUTHENTICATED before its request is even parsed; a node-scoped call (register, heartbeat, publish,
snapshot) naming another node than the caller's credential gets PERMISSION_DENIED, and so does a
cluster-scoped call (Match, GetStats, WatchIndex, ReportPredictions) with a node's credential. All
RPCs run on the server's one event loop, which is what makes the non-thread-safe service safe.
"""

import asyncio
import gc
import logging
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from radixmesh.cluster.metadata.authenticator import Authenticator
from radixmesh.cluster.metadata.feed import FeedClosed
from radixmesh.cluster.metadata.membership import StaleEpoch, UnknownNode
from radixmesh.cluster.metadata.service import MetadataService
from radixmesh.cluster.metadata.service_config import LimitExceeded
from radixmesh.common.secret import ClusterSecret, check_bind
from radixmesh.proto import radixmesh_pb2 as pb
from radixmesh.proto import radixmesh_pb2_grpc as pb_grpc
from radixmesh.proto.ids import NodeId
from radixmesh.proto.metadata import codec
from radixmesh.proto.metadata.hits import MAX_PROMPT_TOKENS
from radixmesh.proto.metadata.messages import MatchPrediction, PublishAck, PublishStatus

logger = logging.getLogger(__name__)

SERVICE_NAME = "radixmesh.v1.MetadataService"
_HEALTH_PREFIX = "/grpc.health.v1.Health/"
T = TypeVar("T")

RECANCEL_S = 0.1
"""How long one cancel is given before it is sent again (a retry schedule, not a synchronisation)."""


async def cancel_and_wait(*tasks: "asyncio.Future[Any]") -> None:
    """Cancel `tasks` and wait until each has ended, cancelling again any that swallowed a cancel.
    What they raised or returned is dropped (their owner is stopping them), hence Future[Any]: a
    Future is invariant in its result, so Future[object] would refuse a Task[None].

    Stopping a task that talks to Redis takes that repeat: redis-py's asyncio client retries a command
    that failed on its connection (its default `Retry`), and a cancel that lands while a command times
    out can come back as redis' TimeoutError with the cancel request withdrawn (`Task.cancelling()`
    back at 0): the task goes on as if never cancelled. A task that then waits on an event nobody sets
    (the state-store writer between writes) never ends, and a stop that awaits it hangs for good.
    """
    pending = {t for t in tasks if not t.done()}
    while pending:
        for t in pending:
            t.cancel()
        _, pending = await asyncio.wait(pending, timeout=RECANCEL_S)
    for t in tasks:
        if not t.cancelled():
            t.exception()  # retrieved: no "exception was never retrieved" warning


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """PEM files for server-side TLS, and what its clients trust."""

    cert_chain: bytes
    private_key: bytes
    ca: bytes | None = None
    """PEM of the CA clients verify the server against (common.cluster_ca); None: `cert_chain` itself
    (a self-signed certificate, `up --tls-cert`)."""

    @property
    def trust(self) -> bytes:
        """The root certificates a client of this server is given."""
        return self.ca or self.cert_chain


@dataclass(frozen=True, slots=True)
class ServerOptions:
    host: str = "127.0.0.1"
    port: int = 0
    """0 picks a free port; create_server returns the one bound."""
    secret: ClusterSecret | None = None
    """Every MetadataService RPC must carry a credential derived from it (common.metadata.auth);
    None disables authentication, allowed only on a loopback `host`."""
    tls: TlsFiles | None = None
    max_message_bytes: int = 16 << 20
    """Larger messages are refused by gRPC with RESOURCE_EXHAUSTED."""
    upkeep_interval_s: float | None = 5.0
    """How often leases are swept and the index persisted; None: only on calls and at stop."""


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Refuses every MetadataService RPC without a valid credential with UNAUTHENTICATED.

    The health service stays open: orchestrator probes carry no credentials and health reveals
    nothing about the cluster.
    """

    def __init__(self, authenticator: Authenticator) -> None:
        self._authenticator = authenticator

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if details.method.startswith(_HEALTH_PREFIX) or handler is None:
            return handler
        if self._authenticator.authenticate(details.invocation_metadata) is not None:
            return handler
        return _refusal(handler)


def _refusal(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """A handler of the same shape as `handler` that aborts with UNAUTHENTICATED."""

    async def deny(_request: object, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong cluster credential")

    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(deny)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(deny)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(deny)
    return grpc.unary_unary_rpc_method_handler(deny)


async def _guarded(context: grpc.aio.ServicerContext, call: Callable[[], T]) -> T:
    try:
        return call()
    except LimitExceeded as e:
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(e))
    except ValueError as e:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
    except StaleEpoch as e:
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
    except UnknownNode as e:
        await context.abort(grpc.StatusCode.NOT_FOUND, str(e))
    raise AssertionError("context.abort returned")


class MetadataServicer(pb_grpc.MetadataServiceServicer):
    """Converts, calls MetadataService, maps errors; holds no logic of its own."""

    def __init__(self, service: MetadataService, authenticator: Authenticator) -> None:
        self._service = service
        self._authenticator = authenticator

    async def _speaks_for(self, context: grpc.aio.ServicerContext, node: str) -> None:
        """Abort with PERMISSION_DENIED unless the caller holds `node`'s credential (the interceptor
        already refused callers without any valid credential)."""
        caller = self._authenticator.authenticate(context.invocation_metadata())
        if caller is None or not caller.may_speak_for(node, self._authenticator.open):
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                f"this credential does not speak for node {node[:80]!r}")

    async def _cluster_only(self, context: grpc.aio.ServicerContext) -> None:
        """Abort with PERMISSION_DENIED unless the caller is the cluster principal: these RPCs read
        every node's state or steer every router, and a node's token is seen on the wire without TLS."""
        caller = self._authenticator.authenticate(context.invocation_metadata())
        if caller is None or not caller.is_cluster:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "only the cluster credential may call this RPC")

    async def RegisterNode(self, request: pb.RegisterNodeRequest, context: grpc.aio.ServicerContext) -> pb.Lease:
        await self._speaks_for(context, request.node_id)
        s = self._service
        return await _guarded(context, lambda: codec.lease_to_pb(s.register(codec.node_info_from_pb(request))))

    async def Heartbeat(self, request: pb.HeartbeatRequest, context: grpc.aio.ServicerContext) -> pb.Lease:
        await self._speaks_for(context, request.node_id)

        def call() -> pb.Lease:
            hits = [codec.hits_from_pb(h) for h in request.hits]
            load = codec.load_from_pb(request.load)
            return codec.lease_to_pb(self._service.heartbeat(NodeId(request.node_id), request.epoch, load, hits))

        return await _guarded(context, call)

    async def PublishEvents(
        self, request_iterator: AsyncIterator[pb.EventBatch], context: grpc.aio.ServicerContext
    ) -> pb.PublishAck:
        ack = PublishAck(PublishStatus.OK, 0)
        async for msg in request_iterator:
            await self._speaks_for(context, msg.node_id)
            ack = await _guarded(context, partial(self._publish, msg))
            if ack.status is PublishStatus.RESYNC:
                break  # later batches would all gap too: answer now so the node resyncs at once
        return codec.ack_to_pb(ack)

    def _publish(self, msg: pb.EventBatch) -> PublishAck:
        return self._service.publish(codec.batch_from_pb(msg))

    async def SyncSnapshot(self, request: pb.NodeSnapshot, context: grpc.aio.ServicerContext) -> pb.PublishAck:
        await self._speaks_for(context, request.node_id)
        s = self._service
        return await _guarded(context, lambda: codec.ack_to_pb(s.sync_snapshot(codec.snapshot_from_pb(request))))

    async def Match(self, request: pb.MatchRequest, context: grpc.aio.ServicerContext) -> pb.MatchResponse:
        await self._cluster_only(context)
        s = self._service
        return await _guarded(
            context, lambda: codec.match_response_to_pb(s.match(codec.match_request_from_pb(request)))
        )

    async def GetStats(self, request: pb.GetStatsRequest, context: grpc.aio.ServicerContext) -> pb.ClusterStats:
        await self._cluster_only(context)
        return codec.stats_to_pb(self._service.stats())

    async def WatchIndex(
        self, request: pb.WatchIndexRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.IndexUpdate]:
        await self._cluster_only(context)
        sub, first = self._service.watch()
        try:
            yield codec.update_to_pb(first)
            while True:
                try:
                    batch = await sub.next_batch()
                except FeedClosed:
                    return
                if batch is None:
                    logger.info("an index watcher fell behind: sending it a fresh snapshot")
                    yield codec.update_to_pb(self._service.resnapshot(sub))
                    continue
                for update in batch:
                    yield codec.update_to_pb(update)
        finally:
            self._service.feed.unsubscribe(sub)

    async def ReportPredictions(
        self, request: pb.PredictionBatch, context: grpc.aio.ServicerContext
    ) -> pb.ReportAck:
        await self._cluster_only(context)

        def call() -> None:
            router_id, predictions = codec.predictions_from_pb(request)
            _check_predictions(predictions, lambda node: self._service.membership.get(node) is not None)
            self._service.record_predictions(predictions, router_id)

        await _guarded(context, call)
        return pb.ReportAck()


def _check_predictions(predictions: Sequence[MatchPrediction], is_live: Callable[[NodeId], bool]) -> None:
    """ValueError unless every node a prediction names is live and every figure is at most a prompt's
    tokens: hit accounting keeps the predictions and every router's load table adds the routed work."""
    for p in predictions:
        named = [*p.local_tokens, *([p.routed_node] if p.routed_node is not None else [])]
        unknown = next((n for n in named if not is_live(n)), None)
        if unknown is not None:
            raise ValueError(f"prediction {p.request_id!r} names {unknown[:80]!r}, not a live node")
        top = max(p.cluster_tokens, p.routed_tokens, *p.local_tokens.values())
        if top > MAX_PROMPT_TOKENS:
            raise ValueError(f"prediction {p.request_id!r} counts {top} tokens, more than a prompt's "
                             f"{MAX_PROMPT_TOKENS}")


class MetadataServer:
    """One bound grpc.aio server for a MetadataService, with its health service and upkeep task.

    `stop` is graceful: health turns NOT_SERVING, in-flight calls drain, the index is persisted
    and the state store released. State that survives a restart is what the store holds.
    """

    def __init__(
        self,
        server: grpc.aio.Server,
        health_servicer: health.aio.HealthServicer,
        service: MetadataService,
        upkeep_interval_s: float | None,
    ) -> None:
        self._server = server
        self._health = health_servicer
        self.service = service
        self._upkeep_interval_s = upkeep_interval_s
        self._upkeep: asyncio.Task[None] | None = None
        self._writer: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self._server.start()
        await self._health.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
        if self._upkeep_interval_s is not None:
            self._upkeep = asyncio.create_task(self._run_upkeep(self._upkeep_interval_s))
        self._writer = asyncio.create_task(self.service.store.write_behind(), name="state-store-writer")

    async def stop(self, grace_s: float | None = 5.0) -> None:
        await self._health.enter_graceful_shutdown()
        self.service.feed.close()  # watch streams never end on their own: end them before draining
        await cancel_and_wait(*(t for t in (self._upkeep, self._writer) if t is not None))
        await self._server.stop(grace_s)
        self.service.close()

    async def wait_for_termination(self) -> None:
        await self._server.wait_for_termination()

    async def _run_upkeep(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                self.service.tick()
            except Exception:
                # A store outage must not end lease expiry for good; the next round retries.
                logger.exception("metadata service upkeep failed")


def create_server(
    service: MetadataService, options: ServerOptions, *extra_handlers: grpc.GenericRpcHandler
) -> tuple[MetadataServer, int]:
    """A bound, not yet started server for `service`; `await server.start()` serves it.

    Call it from the event loop that will run the server: grpc.aio binds to the running loop.

    Returns the port bound (the one asked for, or a free one for port 0). `extra_handlers` are
    served behind the same authentication and limits (the benchmark's echo baseline uses this).
    ValueError for a non-loopback host without a secret.
    """
    check_bind("the metadata service", options.host, options.secret)
    limit = options.max_message_bytes
    authenticator = Authenticator(options.secret)
    server = grpc.aio.server(
        interceptors=[AuthInterceptor(authenticator)],
        options=[("grpc.max_receive_message_length", limit), ("grpc.max_send_message_length", limit)],
    )
    pb_grpc.add_MetadataServiceServicer_to_server(MetadataServicer(service, authenticator), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    if extra_handlers:
        server.add_generic_rpc_handlers(extra_handlers)
    address = f"{options.host}:{options.port}"
    if options.tls is None:
        port = server.add_insecure_port(address)
    else:
        creds = grpc.ssl_server_credentials([(options.tls.private_key, options.tls.cert_chain)])
        port = server.add_secure_port(address, creds)
    return MetadataServer(server, health_servicer, service, options.upkeep_interval_s), port


def tune_gc_for_serving() -> None:
    """Set the garbage collector of a process that does nothing but serve, once start-up is done.

    What start-up built (modules, grpc, a restored index) lives as long as the process, yet every
    full collection would traverse it: a pause of tens of ms on the request path, seen as Match
    p99. `gc.freeze` moves it out of the collector's sight. The young-generation threshold stays
    at its default on purpose: grpc.aio leaves a few reference cycles per RPC (its handler lookup
    closure), so collections must run, and a 10x higher threshold measured ~10x longer pauses
    for the same total. Process-wide and irreversible: call it from a serving process's entry
    point, never from a library or a test process.
    """
    gc.collect()
    gc.freeze()
    logger.info("gc: %d start-up objects frozen", gc.get_freeze_count())


async def serve_until_signalled(server: MetadataServer, grace_s: float, on_ready: Callable[[], None]) -> None:
    """Start `server`, tune this process's GC for serving, call `on_ready`, serve until
    SIGINT/SIGTERM, then stop gracefully. Meant for a process that only serves (CLI, benchmark)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await server.start()
    tune_gc_for_serving()
    on_ready()
    await stop.wait()
    logger.info("signal received: stopping (grace %.1f s)", grace_s)
    await server.stop(grace_s)
