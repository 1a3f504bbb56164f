"""Messages of the KV transfer plane and their byte encoding.

A pull, from the requester's side, once the handshake (transfer.handshake) authenticated both::

    requester                                   owner
      PullRequest(fingerprint, hashes) ->
                                               <- PullHeader(status, found, payload length)
                                               <- chunk 0 payload + ChunkTrailer(checksum, mac)
                                               <- ...       (chunks of `chunk_blocks` blocks)

A following request (`follow_ms` > 0: a hand-off streamed while the owner still computes the blocks,
docs/disaggregation.md) that finds none of its blocks cached yet waits on the owner up to `follow_ms`
for the first one; a header NOT_YET (no chunks) says they are still being computed there: ask again.

Payload bytes travel on the transport's data path (UCX tagged messages, Ray objects); these small
messages travel on its control path, request and header sealed to the session (transfer.binding).
Every field has a fixed width, so a decoder can reject a malformed or truncated message with
`ProtocolError` before acting on it.
"""

import asyncio
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum

from radixmesh.proto.block_hash import HASH_BYTES, BlockHash

MAX_FRAME_BYTES = 64 << 20
"""Largest control message accepted (a request of ~4M hashes); larger ones are refused unread."""
MAX_HANDSHAKE_FRAME_BYTES = 16 << 10
"""Largest frame before the peer is authenticated: a hello, or a proof and a UCX worker address
(a few hundred bytes over TCP, more with several RDMA devices; 16 KiB leaves room for any)."""
MAX_CHUNK_BYTES = 1 << 30
"""Largest chunk a requester may ask for: what one staging buffer may cost."""
MAX_FOLLOW_MS = 5_000
"""Longest wait a following request may ask of the owner (one round of a streamed hand-off): what a
requester can hold one of the owner's connections for without a block moving."""
MAC_BYTES = 16
NO_MAC = bytes(MAC_BYTES)
"""The trailer's MAC when the requester asked for none."""


class ProtocolError(ValueError):
    """A message that cannot be decoded: wrong kind, truncated, or fields out of range."""


class Status(IntEnum):
    """The owner's answer to a request, mirrored on gRPC codes where one fits."""

    OK = 0
    UNAUTHENTICATED = 16
    LAYOUT_MISMATCH = 9  # FAILED_PRECONDITION: the peer's blocks are not byte-compatible
    INVALID_ARGUMENT = 3
    NOT_YET = 14  # UNAVAILABLE: none of the blocks is cached yet, but a request here is computing the first


class Kind(IntEnum):
    """First byte of every control frame."""

    HELLO = 1
    HELLO_OK = 2
    REQUEST = 3
    HEADER = 4
    TRAILER = 5
    CHALLENGE = 6
    AUTH = 7


@dataclass(frozen=True, slots=True)
class PullRequest:
    """Ask a peer for the longest prefix of `hashes` it holds, at most `max_blocks` of it."""

    pull_id: int
    """Unique among the requester's pulls: its header and trailers name it."""
    fingerprint: str
    """KVLayout.fingerprint() of the requester; the owner refuses any other layout."""
    hashes: tuple[BlockHash, ...]
    max_blocks: int
    chunk_bytes: int
    """The requester's staging size; the owner sends chunks of max(1, chunk_bytes // block_bytes) blocks."""
    checksum: str
    mac: bool = False
    """Ask for a keyed MAC of every chunk (checksum.chunk_mac, keyed by the session and this request):
    integrity against anyone but the authenticated owner, where `checksum` only catches accidents."""
    follow_ms: int = 0
    """Follow blocks the owner is still computing (at most MAX_FOLLOW_MS): when none is cached yet and
    a request there computes the first, wait up to this long for it, then answer NOT_YET if it has
    not come. 0: answer at once with what is cached."""


@dataclass(frozen=True, slots=True)
class PullHeader:
    """The owner's reply: `found` blocks follow in `chunk_blocks`-block chunks (none unless status OK)."""

    pull_id: int
    status: Status
    found: int
    fingerprint: str
    block_bytes: int
    chunk_blocks: int
    message: str = ""


@dataclass(frozen=True, slots=True)
class ChunkTrailer:
    """Sent with chunk `index` of a pull: its length, its checksum and its MAC (NO_MAC unless asked)."""

    pull_id: int
    index: int
    nbytes: int
    checksum: int
    mac: bytes = NO_MAC


def chunk_plan(found: int, chunk_blocks: int) -> list[tuple[int, int]]:
    """(first block, block count) of each chunk: [0, c) [c, 2c) ... [k*c, found)."""
    if chunk_blocks <= 0:
        raise ValueError(f"chunk_blocks must be positive, got {chunk_blocks}")
    return [(s, min(chunk_blocks, found - s)) for s in range(0, found, chunk_blocks)]


def payload_tag(pull: int, index: int) -> int:
    """64-bit UCX tag of chunk `index` of the pull whose secret tag base is `pull`
    (binding.BoundPull.tag_base): the base owns the high 44 bits, chunk indexes the low 20."""
    return ((pull & ((1 << 44) - 1)) << 20) | (index & ((1 << 20) - 1))


# Fixed-width heads; variable parts (token, strings, hashes) follow with their lengths in the head.
_REQUEST = struct.Struct("<QIIQIBBB")  # pull_id, n_hashes, max_blocks, chunk_bytes, follow_ms, mac, len(fp/checksum)
_HEADER = struct.Struct("<QBIQIBH")  # pull_id, status, found, block_bytes, chunk_blocks, len(fp), len(msg)
_TRAILER = struct.Struct(f"<QIQQ{MAC_BYTES}s")
_FRAME = struct.Struct("<IB")


def encode_request(r: PullRequest) -> bytes:
    fp, ck = r.fingerprint.encode(), r.checksum.encode()
    if any(len(h) != HASH_BYTES for h in r.hashes):
        raise ValueError(f"every block hash is {HASH_BYTES} bytes")
    head = _REQUEST.pack(r.pull_id, len(r.hashes), r.max_blocks, r.chunk_bytes, r.follow_ms, r.mac, len(fp), len(ck))
    return b"".join((head, fp, ck, *r.hashes))


def decode_request(data: bytes) -> PullRequest:
    pull_id, n, max_blocks, chunk_bytes, follow_ms, mac, lf, lc = _unpack(_REQUEST, data)
    body = memoryview(data)[_REQUEST.size :]
    if len(body) != lf + lc + n * HASH_BYTES:
        raise ProtocolError(f"request body is {len(body)} bytes, its head announces {lf + lc + n * 16}")
    if mac > 1:
        raise ProtocolError(f"mac flag is 0 or 1, got {mac}")
    fp, ck = bytes(body[:lf]), bytes(body[lf : lf + lc])
    raw = bytes(body[lf + lc :])
    hashes = tuple(BlockHash(raw[i : i + HASH_BYTES]) for i in range(0, len(raw), HASH_BYTES))
    return PullRequest(pull_id, _text(fp), hashes, max_blocks, chunk_bytes, _text(ck), bool(mac), follow_ms)


def encode_header(h: PullHeader) -> bytes:
    fp, msg = h.fingerprint.encode(), h.message.encode()[:4096]
    head = _HEADER.pack(h.pull_id, h.status, h.found, h.block_bytes, h.chunk_blocks, len(fp), len(msg))
    return head + fp + msg


def decode_header(data: bytes) -> PullHeader:
    pull_id, status, found, block_bytes, chunk_blocks, lf, lm = _unpack(_HEADER, data)
    body = data[_HEADER.size :]
    if len(body) != lf + lm:
        raise ProtocolError(f"header body is {len(body)} bytes, its head announces {lf + lm}")
    try:
        st = Status(status)
    except ValueError:
        raise ProtocolError(f"unknown status {status}") from None
    if st is Status.OK and (chunk_blocks <= 0 or block_bytes <= 0):
        raise ProtocolError(f"chunk_blocks {chunk_blocks} and block_bytes {block_bytes} must be positive")
    return PullHeader(pull_id, st, found, _text(body[:lf]), block_bytes, chunk_blocks, _text(body[lf:]))


def encode_trailer(t: ChunkTrailer) -> bytes:
    assert len(t.mac) == MAC_BYTES, len(t.mac)
    return _TRAILER.pack(t.pull_id, t.index, t.nbytes, t.checksum, t.mac)


def decode_trailer(data: bytes) -> ChunkTrailer:
    if len(data) != _TRAILER.size:
        raise ProtocolError(f"trailer is {len(data)} bytes, expected {_TRAILER.size}")
    return ChunkTrailer(*_TRAILER.unpack(data))


async def write_frame(writer: asyncio.StreamWriter, kind: Kind, body: bytes) -> None:
    """Send one control frame: u32 length, u8 kind, body."""
    writer.write(_FRAME.pack(len(body), kind) + body)
    await writer.drain()


async def read_frame(reader: asyncio.StreamReader, expect: Kind, limit: int = MAX_FRAME_BYTES,
                     head_timeout_s: float | None = None) -> bytes:
    """Read one frame of kind `expect`; ProtocolError on another kind or a frame over `limit` bytes.

    asyncio.IncompleteReadError (a subclass of EOFError) means the peer closed the connection;
    TimeoutError that the frame's 5-byte head did not arrive within `head_timeout_s` (None: no bound).
    """
    async with asyncio.timeout(head_timeout_s):
        n, kind = _FRAME.unpack(await reader.readexactly(_FRAME.size))
    if n > limit:
        raise ProtocolError(f"frame of {n} bytes exceeds {limit}")
    body = await reader.readexactly(n)
    if kind != expect:
        raise ProtocolError(f"expected a {expect.name} frame, got kind {kind}")
    return body


def _unpack(s: struct.Struct, data: bytes) -> tuple[int, ...]:
    if len(data) < s.size:
        raise ProtocolError(f"message of {len(data)} bytes is shorter than its {s.size}-byte head")
    return s.unpack_from(data)


def _text(raw: bytes | Sequence[int]) -> str:
    try:
        return bytes(raw).decode()
    except UnicodeDecodeError:
        raise ProtocolError("text field is not UTF-8") from None
