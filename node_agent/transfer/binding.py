"""A pull bound to the handshake that authenticated its two ends: whoever lacks the session key can
neither alter, replay, redirect nor inject any part of it.

Every message of a pull is keyed by the session key K of its handshake (transfer.handshake)::

    AUTH     proof ‖ address ‖ M(K, "address", address)      the one worker the owner will send to
    REQUEST  r ‖ D,   D = M(K, "request", seq ‖ r)            every field of r: hashes, counts, chunk size, flags
    HEADER   h ‖ M(P, "header", h),   P = PRF(K, "chunk" ‖ D)  the answer to this request and no other
    chunk i  UCX tag payload_tag(B, i),   B = PRF(K, "tag" ‖ D)    secret: nobody else can aim at it
             trailer MAC checksum.chunk_mac(P, i, payload)

PRF is HMAC-SHA256, M the same truncated to MAC_BYTES. `seq` numbers a session's requests from 0 on
both sides (UCX: the requests of one connection; Ray: each call is a session of its own, seq 0), so
a request replayed on its connection does not verify and no two pulls share a digest D: every
chunk's one-time MAC key is used once. D is in everything the owner sends back, so a man in the
middle who rewrites the hash list (or any other field) makes a request the owner refuses, and cannot
make the requester file one prefix's blocks under another prefix's hashes.

Without the chunk MAC (PullConfig.mac off, the default) the payload itself is not authenticated:
an attacker who reads the wire can still alter it. The secret tags keep everyone else out: a
message aimed at the requester's worker lands in no pull unless its sender knows K.
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
