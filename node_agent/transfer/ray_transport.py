"""Ray fallback transport: a pull is a call to the owner's transfer actor, streamed back in chunks.

Where ucxx cannot load, the owner's agent actor serves its TransferSource: peers find that actor
by the name in its transfer address ("ray:<actor name>"), and its `pull` method is a streaming
generator (`serve_pull`): the header, then one
(trailer, payload) object per chunk, so the object store moves chunk i while the owner gathers
i+1. The owner's pins are held inside the generator and released in its `finally`, which Ray runs
when the stream ends, fails, or its consumer goes away.

Each call carries the requester's one-shot handshake (transfer.handshake) before the request, sealed
to the session that handshake makes (transfer.binding: each call is a session of its own); the
owner answers its own proof with the header, sealed to that request, so each side knows the other
holds its node credential and answers this very request.
"""

import asyncio
import struct
import warnings
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import ray
import torch

from radixmesh.node_agent.transfer import Serial, run_inline
from radixmesh.node_agent.transfer.binding import BindingError, SessionBinding, open_header, seal_header
from radixmesh.node_agent.transfer.handshake import (
    HandshakeError,
    NodeIdentity,
    OwnerHandshake,
    ReplayGuard,
    RequesterHandshake,
)
from radixmesh.node_agent.transfer.protocol import (
    MAX_HANDSHAKE_FRAME_BYTES,
    ChunkTrailer,
    ProtocolError,
    PullHeader,
    PullRequest,
    Status,
    chunk_plan,
    decode_header,
    decode_request,
    decode_trailer,
    encode_header,
    encode_request,
    encode_trailer,
)
from radixmesh.node_agent.transfer.pull_source import OpenPull, TransferSource, open_pull
from radixmesh.node_agent.transfer.transport import (
    Peer,
    PeerChannel,
    PeerUnauthenticated,
    Transport,
    TransportError,
)
from radixmesh.proto.ids import NodeId

_AUTH_LEN = struct.Struct("<H")


def encode_call(auth: bytes, request: bytes) -> bytes:
    """One pull call's argument: the one-shot handshake, then the encoded PullRequest."""
    return _AUTH_LEN.pack(len(auth)) + auth + request


async def serve_pull(source: TransferSource, message: bytes, identity: NodeIdentity, guard: ReplayGuard,
                     serial: Serial = run_inline) -> AsyncIterator[Any]:
    """One pull as an actor's streaming generator: (owner proof, sealed header), then (encoded
    trailer, uint8 payload array) per chunk. A requester that does not prove its credential, or whose
    request is not sealed to its session, gets an UNAUTHENTICATED header and no proof, before
    anything is decoded or pinned. Pinning and unpinning run through `serial` (the node agent passes
    its engine thread); the pins are released however the stream ends, consumer gone included."""
    try:
        (n,) = _AUTH_LEN.unpack_from(message)
        if n > MAX_HANDSHAKE_FRAME_BYTES or len(message) < _AUTH_LEN.size + n:
            raise HandshakeError("malformed handshake")
        proof, session = OwnerHandshake(identity.secret, identity.node_id).one_shot(
            message[_AUTH_LEN.size : _AUTH_LEN.size + n], guard)
        body, bound = SessionBinding(session).open_request(message[_AUTH_LEN.size + n :])
    except (HandshakeError, BindingError, struct.error) as e:
        yield b"", seal_header(None, encode_header(PullHeader(0, Status.UNAUTHENTICATED, 0, "", 0, 1, str(e))))
        return
    try:
        req = decode_request(body)
    except ProtocolError as e:
        yield proof, seal_header(bound, encode_header(PullHeader(0, Status.INVALID_ARGUMENT, 0, "", 0, 1, str(e))))
        return
    pull: OpenPull = await open_pull(source, req, bound.chunk_session, serial)
    try:
        yield proof, seal_header(bound, encode_header(pull.header))
        if pull.header.status is Status.OK:
            for trailer, payload in pull.chunks():
                # Yielding copies the payload into the object store before the generator resumes,
                # so the view of pinned blocks is never read after they are released.
                yield encode_trailer(trailer), _host_bytes(payload)
            pull.delivered()
    finally:
        await serial(pull.close)


class RayChannel(PeerChannel):
    """Pulls from one peer's actor (`serve_pull` behind its `pull` method); each pull is one streaming
    call, authenticated on its own."""

    def __init__(self, actor: Any, identity: NodeIdentity, owner: NodeId):
        self._actor = actor
        self._identity = identity
        self._owner = owner
        self._stream: Any = None

    async def request(self, request: PullRequest) -> PullHeader:
        handshake = RequesterHandshake(self._identity.secret, self._identity.node_id, self._owner)
        sealed, self.pull = SessionBinding(handshake.one_shot_session()).seal_request(encode_request(request))
        self._stream = self._actor.pull.options(num_returns="streaming").remote(encode_call(handshake.one_shot(), sealed))
        try:
            proof, raw = await self._next()
            if not proof:  # refused before the owner proved anything: nothing it says is authentic
                raise PeerUnauthenticated(f"{self._owner} refused our credential or our request")
            handshake.check_owner(proof)
            header = decode_header(open_header(self.pull, raw))
        except (HandshakeError, BindingError) as e:
            raise PeerUnauthenticated(str(e)) from e
        except (ProtocolError, TypeError, ValueError) as e:
            raise TransportError(f"bad header from transfer actor: {e}") from e
        if header.pull_id != request.pull_id and header.status is Status.OK:
            raise TransportError(f"header for pull {header.pull_id}, expected {request.pull_id}")
        return header

    async def chunks(self, header: PullHeader) -> AsyncIterator[tuple[ChunkTrailer, torch.Tensor]]:
        for i, (_, n) in enumerate(chunk_plan(header.found, header.chunk_blocks)):
            raw, payload = await self._next()
            try:
                trailer = decode_trailer(raw)
            except ProtocolError as e:
                raise TransportError(str(e)) from e
            if (trailer.pull_id, trailer.index) != (header.pull_id, i):
                raise TransportError(f"trailer {trailer.pull_id}/{trailer.index}, expected {header.pull_id}/{i}")
            expected = n * header.block_bytes
            if not isinstance(payload, np.ndarray) or payload.dtype != np.uint8 or payload.size != expected:
                raise TransportError(f"chunk {i} of pull {header.pull_id} is not {expected} bytes")
            with warnings.catch_warnings():
                # Object-store arrays are read-only; the payload is only read (scattered) from.
                warnings.simplefilter("ignore", UserWarning)
                yield trailer, torch.from_numpy(payload)
        # Run the owner's generator to its end, so its `finally` (the unpin) has run when we return.
        try:
            await self._stream.__anext__()
        except StopAsyncIteration:
            return
        except ray.exceptions.RayError as e:
            raise TransportError(f"transfer actor failed: {e}") from e
        raise TransportError("transfer actor sent more chunks than its header announced")

    async def _next(self) -> Any:
        try:
            return await (await self._stream.__anext__())
        except StopAsyncIteration:
            raise TransportError("transfer actor ended the stream early") from None
        except ray.exceptions.RayError as e:
            raise TransportError(f"transfer actor failed: {e}") from e

    async def close(self) -> None:
        # Dropping the stream lets Ray cancel the generator; payload lands in Ray-owned objects, never
        # in the caller's memory, so nothing can arrive late.
        self._stream = None


class RayTransport(Transport):
    """Channels to peers' actors, found by name in the current Ray cluster, authenticated as `identity`."""

    name = "ray"

    def __init__(self, identity: NodeIdentity):
        self._identity = identity

    async def connect(self, peer: Peer) -> PeerChannel:
        name = peer.actor_name
        if not name:
            raise TransportError(f"peer {peer.node_id} has no Ray actor name to pull from")
        try:
            actor = await asyncio.to_thread(ray.get_actor, name)
        except ValueError as e:
            raise TransportError(f"no transfer actor {name!r}: {e}") from e
        return RayChannel(actor, self._identity, peer.node_id)


def _host_bytes(t: torch.Tensor) -> np.ndarray:
    return t.reshape(-1).view(torch.uint8).cpu().numpy()

