"""TransferServer: a node's UCX transfer endpoint, serving pulls out of a TransferSource.

One TCP control connection per requester (bound to the address it is given), one UCX endpoint per
connection to the requester's worker. Pulls on a connection are served one at a time; connections
are served concurrently. See ucx_transport for why control and payload travel separately.

A connection does no work before its requester is authenticated (transfer.handshake): frames stay
small (MAX_HANDSHAKE_FRAME_BYTES), the whole handshake has `handshake_timeout_s`, and only then is
a UCX endpoint created from the address the requester sent. At most `max_connections` are open; one
past that is closed at once, so idle or slow peers cannot exhaust the owner.
"""

import asyncio
import logging
from collections import deque
from typing import Any

from radixmesh.common.secret import ClusterSecret
from radixmesh.node_agent.transfer import Serial, run_inline, ucx_progress
from radixmesh.node_agent.transfer.handshake import PROOF_BYTES, HandshakeError, OwnerHandshake, Session
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
from radixmesh.node_agent.transfer.source import OpenPull, TransferSource
from radixmesh.node_agent.transfer.ucx_transport import import_ucxx, wire_buffer
from radixmesh.proto.ids import NodeId

logger = logging.getLogger(__name__)

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
                 max_connections: int = 256, loopback: bool = False, serial: Serial = run_inline):
        if min(send_timeout_s, handshake_timeout_s) <= 0 or max_connections < 1:
            raise ValueError("send_timeout_s and handshake_timeout_s must be positive, max_connections >= 1")
        self.source = source
        self._secret = secret
        self.node_id = node_id
        self._handshake_timeout_s = handshake_timeout_s
        self._max_connections = max_connections
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
        """Connections closed before any work: over the cap, or not authenticated."""

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
            try:
                async with asyncio.timeout(self._handshake_timeout_s):
                    session, address = await self._authenticate(reader, writer)
            except (HandshakeError, TimeoutError, ProtocolError, EOFError) as e:
                self.refused_connections += 1
                logger.warning("transfer connection refused: %r", e)
                return
            ep = await self._ucxx.create_endpoint_from_worker_address(
                self._ucxx.get_ucx_address_from_buffer(address))
            ucx_progress.nudge(self._ucxx)  # ucxx progressed the worker itself: re-arm it
            await write_frame(writer, Kind.HELLO_OK, b"")
            while True:
                body = await read_frame(reader, Kind.REQUEST)
                try:
                    request = decode_request(body)
                except ProtocolError as e:
                    bad = PullHeader(0, Status.INVALID_ARGUMENT, 0, "", 0, 1, str(e))
                    await write_frame(writer, Kind.HEADER, encode_header(bad))
                    continue
                self._active_pulls += 1
                try:
                    pull: OpenPull = await self._serial(self.source.open, request, session)
                    try:
                        await write_frame(writer, Kind.HEADER, encode_header(pull.header))
                        if pull.header.status is Status.OK and pull.header.found:
                            await self._send_watched(pull, ep, writer, hangup)
                            pull.delivered()
                        self.pulls_served += 1
                    finally:
                        await self._serial(pull.close)
                finally:
                    async with self._idle:
                        self._active_pulls -= 1
                        self._idle.notify_all()
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

    async def _authenticate(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
                            ) -> tuple[Session, bytes]:
        """The handshake; (session, the requester's UCX worker address). HandshakeError when the
        requester does not prove its credential."""
        handshake = OwnerHandshake(self._secret, self.node_id)
        hello = await read_frame(reader, Kind.HELLO, MAX_HANDSHAKE_FRAME_BYTES)
        await write_frame(writer, Kind.CHALLENGE, handshake.challenge(hello))
        auth = await read_frame(reader, Kind.AUTH, MAX_HANDSHAKE_FRAME_BYTES)
        session = handshake.verify(auth[:PROOF_BYTES])
        return session, auth[PROOF_BYTES:]

    async def _send_watched(self, pull: OpenPull, ep: Any, writer: asyncio.StreamWriter,
                            hangup: "asyncio.Future[None]") -> None:
        """Send `pull`, ending it early when the requester hangs up or the send times out."""
        send = asyncio.ensure_future(self._send(pull, ep, writer))
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

    async def _send(self, pull: OpenPull, ep: Any, writer: asyncio.StreamWriter) -> None:
        # At most two sends in flight: the next chunk is gathered and checksummed while one is sent.
        inflight: deque[asyncio.Future[Any]] = deque()
        try:
            for trailer, payload in pull.chunks():
                tag = payload_tag(trailer.pull_id, trailer.index)
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
