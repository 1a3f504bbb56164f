"""UCX transport through ucxx: a TCP control connection per peer, payload as UCX tagged messages.

The control connection is a plain asyncio TCP stream on the address given (ucxx's listener binds
every interface); both sides authenticate there, and the owner sends each chunk to the requester's
worker under a secret tag, into staging buffers the requester owns. A random sentinel at the end of
each receive catches short messages, which ucxx does not report. Progress is ucx_progress's driver;
`ucx_env()` (ucx_env.py) is the one place that decides UCX's settings. Why each: docs/routing.md#the-ucx-transport.
"""

import asyncio
import os
import secrets
from collections.abc import AsyncIterator
from types import ModuleType
from typing import Any

import torch

from radixmesh.node_agent.transfer import ucx_progress
from radixmesh.node_agent.transfer.binding import BindingError, SessionBinding, open_header
from radixmesh.node_agent.transfer.handshake import HandshakeError, NodeIdentity, RequesterHandshake
from radixmesh.node_agent.transfer.memory_path import MemoryPath, host_buffer, memory_path
from radixmesh.node_agent.transfer.protocol import (
    MAX_HANDSHAKE_FRAME_BYTES,
    ChunkTrailer,
    Kind,
    ProtocolError,
    PullHeader,
    PullRequest,
    chunk_plan,
    decode_header,
    decode_trailer,
    encode_request,
    payload_tag,
    read_frame,
    write_frame,
)
from radixmesh.node_agent.transfer.transport import (
    Peer,
    PeerChannel,
    PeerUnauthenticated,
    Transport,
    TransportError,
)
from radixmesh.node_agent.transfer.ucx_env import ucx_env

SENTINEL_BYTES = 8


def import_ucxx(loopback: bool = False) -> ModuleType:
    """Import ucxx after setting ucx_env(loopback) (values already set by the operator win), with
    ucx_progress's driver installed for its blocking mode."""
    for k, v in ucx_env(loopback).items():
        os.environ.setdefault(k, v)
    import ucxx

    ucx_progress.install(ucxx)
    return ucxx


def wire_buffer(t: torch.Tensor) -> Any:
    """What ucxx sends from or receives into: host memory as a numpy view, device memory as is."""
    flat = t.reshape(-1).view(torch.uint8)
    return flat.numpy() if flat.device.type == "cpu" else flat


class UcxChannel(PeerChannel):
    """TCP control stream to one TransferServer; payload received by tag on this process's worker."""

    def __init__(self, ucxx: ModuleType, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 binding: SessionBinding, staging_device: torch.device, pool_device: torch.device):
        self._binding = binding
        self._staging_device = staging_device
        self._pool_device = pool_device
        self._ucxx = ucxx
        self._reader = reader
        self._writer = writer
        self._staging: list[torch.Tensor] = []
        self._broken = False

    async def request(self, request: PullRequest) -> PullHeader:
        sealed, self.pull = self._binding.seal_request(encode_request(request))
        try:
            await write_frame(self._writer, Kind.REQUEST, sealed)
            header = decode_header(open_header(self.pull, await read_frame(self._reader, Kind.HEADER)))
        except BindingError as e:
            self._broken = True
            raise PeerUnauthenticated(f"pull {request.pull_id}: {e}") from e
        except (OSError, EOFError, ProtocolError) as e:
            self._broken = True
            raise TransportError(f"control stream failed: {e!r}") from e
        if header.pull_id != request.pull_id:
            self._broken = True
            raise TransportError(f"header for pull {header.pull_id}, expected {request.pull_id}")
        return header

    async def chunks(self, header: PullHeader) -> AsyncIterator[tuple[ChunkTrailer, torch.Tensor]]:
        plan = chunk_plan(header.found, header.chunk_blocks)
        staging = self._staging_for(header.chunk_blocks * header.block_bytes)
        # Two receives in flight: chunk i+1 lands in one staging buffer while the caller scatters i.
        posted: dict[int, tuple[asyncio.Future[Any], bytes]] = {}
        completed = False
        try:
            for i in range(min(2, len(plan))):
                posted[i] = self._post(header, i, plan[i][1], staging[i % 2])
            for i, (_, n) in enumerate(plan):
                trailer = decode_trailer(await read_frame(self._reader, Kind.TRAILER))
                if (trailer.pull_id, trailer.index) != (header.pull_id, i):
                    raise ProtocolError(f"trailer {trailer.pull_id}/{trailer.index}, expected {header.pull_id}/{i}")
                received, sentinel = posted.pop(i)
                await received
                payload = staging[i % 2][: n * header.block_bytes]
                if _tail(payload) == sentinel:
                    raise ProtocolError(f"chunk {i} of pull {header.pull_id} is shorter than its {payload.numel()} bytes")
                yield trailer, payload
                if i + 2 < len(plan):
                    posted[i + 2] = self._post(header, i + 2, plan[i + 2][1], staging[i % 2])
            completed = True
        except (OSError, EOFError, ProtocolError, self._ucxx.exceptions.UCXError) as e:
            raise TransportError(f"pull {header.pull_id} broke: {e!r}") from e
        finally:
            if not completed:
                # A receive still posted may complete later: its staging buffer is dropped here (the
                # progress driver keeps it alive until UCX ends the request), never reused, and this
                # channel is not used again.
                self._broken = True
                self._staging = []
                for f, _ in posted.values():
                    f.cancel()

    def _post(self, header: PullHeader, index: int, n: int, buf: torch.Tensor
              ) -> tuple["asyncio.Future[Any]", bytes]:
        region = buf[: n * header.block_bytes]
        sentinel = secrets.token_bytes(min(SENTINEL_BYTES, region.numel()))
        region[-len(sentinel) :] = torch.frombuffer(bytearray(sentinel), dtype=torch.uint8)
        view = wire_buffer(region)
        return ucx_progress.post_recv(self._ucxx, view, payload_tag(self.pull.tag_base, index)), sentinel

    def _staging_for(self, nbytes: int) -> list[torch.Tensor]:
        if not self._staging or self._staging[0].numel() < nbytes:
            self._staging = [torch.empty(nbytes, dtype=torch.uint8, device=self._staging_device)
                             if self._staging_device.type == "cuda" else host_buffer(nbytes, self._pool_device)
                             for _ in range(2)]
        return self._staging

    @property
    def broken(self) -> bool:
        return self._broken

    async def close(self) -> None:
        self._broken = True
        self._writer.close()
        try:
            await self._writer.wait_closed()
        except OSError:
            pass  # the peer already reset the connection: closed either way


def _tail(payload: torch.Tensor) -> bytes:
    return payload[-min(SENTINEL_BYTES, payload.numel()) :].numpy().tobytes()


class UcxTransport(Transport):
    """Channels over ucxx, authenticated as `identity`; `loopback` keeps UCX on 127.0.0.1 (see ucx_env.LOOPBACK_ENV)."""

    name = "ucx"

    def __init__(self, identity: NodeIdentity, loopback: bool = False, *,
                 pool_device: torch.device = torch.device("cpu")):  # noqa: B008  (immutable)
        """`pool_device`: where the pool that pulled blocks land in lives (memory_path)."""
        self._identity = identity
        self._ucxx = import_ucxx(loopback)
        self._pool_device = pool_device
        direct = memory_path(pool_device, self.active_transports) is MemoryPath.CUDA_DIRECT
        self._staging_device = pool_device if direct else torch.device("cpu")

    def active_transports(self) -> frozenset[str]:
        return frozenset(self._ucxx.get_active_transports())

    async def connect(self, peer: Peer) -> PeerChannel:
        handshake = RequesterHandshake(self._identity.secret, self._identity.node_id, peer.node_id)
        try:
            reader, writer = await asyncio.open_connection(peer.host, peer.port)
        except OSError as e:
            raise TransportError(f"cannot reach {peer.node_id} at {peer.host}:{peer.port}: {e!r}") from e
        try:
            await write_frame(writer, Kind.HELLO, handshake.hello())
            challenge = await read_frame(reader, Kind.CHALLENGE, MAX_HANDSHAKE_FRAME_BYTES)
            proof, session = handshake.answer(challenge)
            binding = SessionBinding(session)
            address: bytes = self._ucxx.get_worker_address().tobytes()
            await write_frame(writer, Kind.AUTH, proof + binding.seal_address(address))
            await read_frame(reader, Kind.HELLO_OK, 0)
        except HandshakeError as e:
            writer.close()
            raise PeerUnauthenticated(f"{peer.host}:{peer.port} is not node {peer.node_id}: {e}") from e
        except (OSError, EOFError, ProtocolError) as e:
            writer.close()
            # An owner that does not accept our proof closes the connection before HELLO_OK.
            raise PeerUnauthenticated(f"{peer.node_id} at {peer.host}:{peer.port} refused the handshake: {e!r}"
                                      ) from e
        return UcxChannel(self._ucxx, reader, writer, binding, self._staging_device, self._pool_device)

