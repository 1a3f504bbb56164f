"""A pull bound to the handshake that authenticated its two ends: whoever lacks the session key can
neither alter, replay, redirect nor inject any part of it.

Every message of a pull (the AUTH's worker address, the REQUEST, the HEADER, each chunk's UCX tag
and trailer MAC) is keyed by the session key of its handshake (transfer.handshake) and, past the
request, by the request's digest, numbered per session so no two pulls share one. The scheme and
what it does not cover: docs/security.md#a-pull-bound-to-its-handshake.
"""

import hashlib
import hmac
import struct
from dataclasses import dataclass

from radixmesh.node_agent.transfer.handshake import Session
from radixmesh.node_agent.transfer.protocol import MAC_BYTES
from radixmesh.proto.ids import NodeId

_SEQ = struct.Struct("<Q")
_TAG_BASE_BITS = 44
"""payload_tag keeps the high 44 bits of a tag for the pull, the low 20 for the chunk index."""


class BindingError(Exception):
    """A message that is not bound to this session: altered in flight, replayed, or of another pull."""


def _prf(key: bytes, label: bytes, *parts: bytes) -> bytes:
    return hmac.new(key, b"".join((label, b"\x00", *parts)), hashlib.sha256).digest()


def _seal(key: bytes, label: bytes, body: bytes, *context: bytes) -> bytes:
    return body + _prf(key, label, *context, body)[:MAC_BYTES]


def _open(key: bytes, label: bytes, sealed: bytes, *context: bytes) -> bytes:
    body, mac = sealed[:-MAC_BYTES], sealed[-MAC_BYTES:]
    if len(sealed) < MAC_BYTES or not hmac.compare_digest(mac, _prf(key, label, *context, body)[:MAC_BYTES]):
        raise BindingError(f"{label.decode()} is not bound to this session: altered in flight or replayed")
    return body


@dataclass(frozen=True, slots=True)
class BoundPull:
    """One pull's keys, derived from its session and the digest of its request."""

    peer: NodeId
    """The node at the other end (Session.peer)."""
    digest: bytes
    """D: the request's MAC, which every reply of the owner carries."""
    chunk_key: bytes
    """P: keys the pull's chunk MACs (checksum.chunk_mac)."""
    tag_base: int
    """B: the high bits of every payload tag of the pull (protocol.payload_tag)."""

    @classmethod
    def of(cls, session: Session, digest: bytes) -> "BoundPull":
        tag = int.from_bytes(_prf(session.key, b"tag", digest)[:8], "little") & ((1 << _TAG_BASE_BITS) - 1)
        return cls(session.peer, digest, _prf(session.key, b"chunk", digest), tag)

    @property
    def chunk_session(self) -> Session:
        """What TransferSource.open takes: the session narrowed to this pull (its key is P)."""
        return Session(self.peer, self.chunk_key)


class SessionBinding:
    """One end of a session's pulls: seals what it sends, opens what it receives, and counts the
    requests (`seq`). Both ends make one per session and use it for that session only."""

    def __init__(self, session: Session) -> None:
        self._key = session.key
        self._session = session
        self._seq = 0

    def seal_address(self, address: bytes) -> bytes:
        """The requester's UCX worker address, sealed: the owner sends payload to no other worker."""
        return _seal(self._key, b"address", address)

    def open_address(self, sealed: bytes) -> bytes:
        """The worker address `sealed` carries; BindingError when it was altered."""
        return _open(self._key, b"address", sealed)

    def seal_request(self, request: bytes) -> tuple[bytes, BoundPull]:
        """The requester's next request (an encoded PullRequest), sealed, and the pull it opens."""
        sealed = _seal(self._key, b"request", request, self._next_seq())
        return sealed, BoundPull.of(self._session, sealed[-MAC_BYTES:])

    def open_request(self, sealed: bytes) -> tuple[bytes, BoundPull]:
        """The owner's view of the next request: (its encoded PullRequest, its pull); BindingError when
        it was altered, replayed, or is not the request this session expects next."""
        request = _open(self._key, b"request", sealed, self._next_seq())
        return request, BoundPull.of(self._session, sealed[-MAC_BYTES:])

    def _next_seq(self) -> bytes:
        seq = _SEQ.pack(self._seq)
        self._seq += 1
        return seq


def seal_header(pull: BoundPull | None, header: bytes) -> bytes:
    """The owner's encoded PullHeader, bound to `pull`; None (a request that did not verify): an
    unsealed refusal, which the requester reads as "not authentic" whatever it says."""
    if pull is None:
        return header + bytes(MAC_BYTES)
    return _seal(pull.chunk_key, b"header", header)


def open_header(pull: BoundPull, sealed: bytes) -> bytes:
    """The encoded PullHeader answering `pull`; BindingError when it answers anything else."""
    return _open(pull.chunk_key, b"header", sealed)
