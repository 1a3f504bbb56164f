"""TransferServer: a node's UCX transfer endpoint, serving pulls out of a TransferSource.

One TCP control connection per requester (bound to the address it is given), one UCX endpoint per
connection to the requester's worker. Pulls on a connection are served one at a time; connections
are served concurrently. See ucx_transport for why control and payload travel separately.

A connection does no work before its requester is authenticated (transfer.handshake): frames stay
small (MAX_HANDSHAKE_FRAME_BYTES), the whole handshake has `handshake_timeout_s`, and only then is
a UCX endpoint created from the address the requester sent (sealed to the session: transfer.binding).
At most `max_connections` are open. Connections not yet authenticated, which anyone who reaches the
port can open, live under their own smaller caps (pre_auth): per source address and in all, a
newcomer taking the slot of the oldest connection of whoever holds most, and one that sends nothing
is closed after a short first-byte timeout. So silent sockets from a few hosts cannot lock honest
requesters out, and however many hosts open them, authenticated peers keep
`max_connections - PreAuthLimits.total` slots.
"""

import asyncio
import logging
from collections import deque
from typing import Any

from radixmesh.common.secret import ClusterSecret
from radixmesh.node_agent.transfer import Serial, run_inline, ucx_progress
from radixmesh.node_agent.transfer.binding import BindingError, BoundPull, SessionBinding, seal_header
from radixmesh.node_agent.transfer.handshake import PROOF_BYTES, HandshakeError, OwnerHandshake
from radixmesh.node_agent.transfer.pre_auth import PreAuthLimits, PreAuthSlots
from radixmesh.node_agent.transfer.protocol import (
    MAX_HANDSHAKE_FRAME_BYTES,
    Kind,
    ProtocolError,
    PullHeader,
    Status,
    decode_request,
    encode_header,
    encode_trailer,
    payload_tag,
    read_frame,
    write_frame,
)
from radixmesh.node_agent.transfer.pull_source import OpenPull, TransferSource, open_pull
from radixmesh.node_agent.transfer.ucx_transport import import_ucxx, wire_buffer
from radixmesh.proto.ids import NodeId

logger = logging.getLogger(__name__)

DEFAULT_PRE_AUTH = PreAuthLimits()
ABORT_PERIOD_NS = 100_000_000
"""How long aborting an endpoint may wait for UCX (ucxx's default, 10 s, is spent in full when the
peer is dead, with the pins still held)."""


class TransferServer:
    """Listens on `host:port` (port 0: any free port, see `port` after start()).

    `send_timeout_s` bounds the sending of one pull: past it the requester is presumed gone, its
    endpoint is aborted (UCX stops reading the pinned blocks) and the pins are released. Requesters
    prove their node credential, and this server proves `node_id`'s (see transfer.handshake).
    """

    def __init__(self, source: TransferSource, host: str, port: int = 0, *, secret: ClusterSecret,
                 node_id: NodeId, send_timeout_s: float = 30.0, handshake_timeout_s: float = 5.0,
                 max_connections: int = 256, pre_auth: PreAuthLimits = DEFAULT_PRE_AUTH,
                 loopback: bool = False, serial: Serial = run_inline):
        if min(send_timeout_s, handshake_timeout_s) <= 0 or max_connections < 1:
            raise ValueError("send_timeout_s and handshake_timeout_s must be positive, max_connections >= 1")
        self.source = source
        self._secret = secret
        self.node_id = node_id
        self._handshake_timeout_s = handshake_timeout_s
        self._max_connections = max_connections
        self._pre_auth = pre_auth
        self._pending = PreAuthSlots(pre_auth)
        """Unauthenticated connections by source address."""
        # Pinning and unpinning go through `serial` (the node agent's engine thread: its pool is not
        # thread-safe); gathering stays here, as it only reads pinned blocks nobody may write.
        self._serial = serial
        self.host = host
        self.port = port
        self._send_timeout_s = send_timeout_s
        self._ucxx = import_ucxx(loopback)
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self._active_pulls = 0
        self._idle = asyncio.Condition()
        self.pulls_served = 0
        self.pulls_failed = 0
        self.refused_connections = 0
        """Connections closed before any work: over a cap, silent, not authenticated, or whose
        request was not bound to their session."""
        self.silent_connections = 0
        """Of those, closed for sending nothing within PreAuthLimits.first_byte_timeout_s."""

    @property
    def evicted_connections(self) -> int:
        """Of those, closed to make room for a newer unauthenticated one (pre_auth's order)."""
        return self._pending.evicted

    async def start(self) -> int:
        """Start listening; returns the bound port."""
        self._ucxx.continuous_ucx_progress()
        self._server = await asyncio.start_server(self._on_connect, self.host, self.port)
        self.port = int(self._server.sockets[0].getsockname()[1])
        logger.info("transfer server on %s:%d", self.host, self.port)
        return self.port

    async def stop(self) -> None:
        """Stop accepting, end every connection (releasing its pins), wait for their handlers."""
        if self._server is not None:
            self._server.close()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def wait_idle(self) -> None:
        """Return once no pull is being served (its pins released); open connections may stay."""
        async with self._idle:
            await self._idle.wait_for(lambda: self._active_pulls == 0)

    async def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        source = str(writer.get_extra_info("peername", ("",))[0])
        if len(self._handlers) >= self._max_connections:
            self.refused_connections += 1
            writer.close()
            return
        self._handlers.add(task)
        ep: Any = None
        # The pins must not wait for UCX to notice a dead peer: the control connection closing
        # (wait_closed resolves on the peer's FIN or reset, consuming no input) ends a pull. One
        # watcher per connection: cancelling it would cancel the connection's close future itself.
        hangup = asyncio.ensure_future(writer.wait_closed())
        try:
            # An evicted connection's reads end (EOF): it is refused below like any that fails to authenticate.
            ticket = self._pending.admit(source, writer.transport.abort)
            try:
                async with asyncio.timeout(self._handshake_timeout_s):
                    binding, address = await self._authenticate(reader, writer)
            except (HandshakeError, BindingError, TimeoutError, ProtocolError, EOFError, ConnectionError) as e:
                self.refused_connections += 1
                logger.warning("transfer connection from %s refused: %r", source, e)
                return
            finally:
                self._pending.release(source, ticket)
            ep = await self._ucxx.create_endpoint_from_worker_address(
                self._ucxx.get_ucx_address_from_buffer(address))
            ucx_progress.nudge(self._ucxx)  # ucxx progressed the worker itself: re-arm it
            await write_frame(writer, Kind.HELLO_OK, b"")
            while await self._serve_one(binding, reader, writer, ep, hangup):
                pass
        except (EOFError, OSError, ProtocolError, TimeoutError, self._ucxx.exceptions.UCXError) as e:
            # EOF is the normal end of a connection; anything else ends it too, pins released above.
            if not isinstance(e, EOFError):
                self.pulls_failed += 1
                logger.warning("transfer connection ended: %r", e)
        finally:
            if ep is not None:
                ep.abort(period=ABORT_PERIOD_NS)
                ucx_progress.nudge(self._ucxx)
            writer.close()
            await asyncio.gather(hangup, return_exceptions=True)
            self._handlers.discard(task)

    async def _serve_one(self, binding: SessionBinding, reader: asyncio.StreamReader,
                         writer: asyncio.StreamWriter, ep: Any, hangup: "asyncio.Future[None]") -> bool:
        """Read and serve the connection's next request; False when the connection must end (its
        request was not bound to the session: someone in the middle altered or replayed it)."""
        sealed = await read_frame(reader, Kind.REQUEST)
        try:
            body, bound = binding.open_request(sealed)
        except BindingError as e:
            self.refused_connections += 1
            logger.warning("transfer request refused, connection closed: %s", e)
            refusal = PullHeader(0, Status.UNAUTHENTICATED, 0, "", 0, 1, str(e))
            await write_frame(writer, Kind.HEADER, seal_header(None, encode_header(refusal)))
            return False
        try:
            request = decode_request(body)
        except ProtocolError as e:
            bad = PullHeader(0, Status.INVALID_ARGUMENT, 0, "", 0, 1, str(e))
            await write_frame(writer, Kind.HEADER, seal_header(bound, encode_header(bad)))
            return True
        self._active_pulls += 1
        try:
            pull: OpenPull = await open_pull(self.source, request, bound.chunk_session, self._serial)
            try:
                await write_frame(writer, Kind.HEADER, seal_header(bound, encode_header(pull.header)))
                if pull.header.status is Status.OK and pull.header.found:
                    await self._send_watched(pull, bound, ep, writer, hangup)
                    pull.delivered()
                self.pulls_served += 1
            finally:
                await self._serial(pull.close)
        finally:
            async with self._idle:
                self._active_pulls -= 1
                self._idle.notify_all()
        return True

    async def _authenticate(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
                            ) -> tuple[SessionBinding, bytes]:
        """The handshake; (the session's binding, the requester's UCX worker address). HandshakeError
        when the requester does not prove its credential, BindingError when its address was altered,
        TimeoutError when it sends nothing within the first-byte timeout."""
        handshake = OwnerHandshake(self._secret, self.node_id)
        try:
            hello = await read_frame(reader, Kind.HELLO, MAX_HANDSHAKE_FRAME_BYTES,
                                     head_timeout_s=self._pre_auth.first_byte_timeout_s)
        except TimeoutError:
            self.silent_connections += 1
            raise
        await write_frame(writer, Kind.CHALLENGE, handshake.challenge(hello))
        auth = await read_frame(reader, Kind.AUTH, MAX_HANDSHAKE_FRAME_BYTES)
        binding = SessionBinding(handshake.verify(auth[:PROOF_BYTES]))
        return binding, binding.open_address(auth[PROOF_BYTES:])

    async def _send_watched(self, pull: OpenPull, bound: BoundPull, ep: Any, writer: asyncio.StreamWriter,
                            hangup: "asyncio.Future[None]") -> None:
        """Send `pull`, ending it early when the requester hangs up or the send times out."""
        send = asyncio.ensure_future(self._send(pull, bound, ep, writer))
        done, _ = await asyncio.wait({send, hangup}, timeout=self._send_timeout_s,
                                     return_when=asyncio.FIRST_COMPLETED)
        if send in done:
            send.result()
            return
        send.cancel()
        await asyncio.gather(send, return_exceptions=True)
        if hangup in done:
            raise ConnectionResetError("requester hung up mid-pull")
        raise TimeoutError(f"pull {pull.header.pull_id} not sent within {self._send_timeout_s} s")

    async def _send(self, pull: OpenPull, bound: BoundPull, ep: Any, writer: asyncio.StreamWriter) -> None:
        # At most two sends in flight: the next chunk is gathered and checksummed while one is sent,
        # on a worker thread when that costs (OpenPull.off_loop), so UCX progresses the send meanwhile.
        inflight: deque[asyncio.Future[Any]] = deque()
        chunks = pull.chunks()
        try:
            while (chunk := await asyncio.to_thread(next, chunks, None) if pull.off_loop else next(chunks, None)):
                trailer, payload = chunk
                tag = payload_tag(bound.tag_base, trailer.index)
                inflight.append(ucx_progress.post_send(self._ucxx, ep, wire_buffer(payload), tag))
                await write_frame(writer, Kind.TRAILER, encode_trailer(trailer))
                if len(inflight) == 2:
                    await inflight.popleft()
            while inflight:
                await inflight.popleft()
        finally:
            if inflight:
                # Failed or timed out with sends outstanding: abort the endpoint before the caller
                # unpins, so UCX stops reading blocks that may be reused the moment they are unpinned.
                for f in inflight:
                    f.cancel()
                ep.abort(period=ABORT_PERIOD_NS)
