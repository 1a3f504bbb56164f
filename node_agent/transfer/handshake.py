"""Mutual authentication of a requester and an owner before any hash is sent or byte accepted.

Each side proves it holds its node's handshake key by a keyed MAC over a transcript that includes a
fresh nonce of the other side (HELLO / CHALLENGE / AUTH); no key travels. The requester names the
owner it expects; both then share a session key that binds every message of their pulls
(transfer.binding). On the Ray transport the owner's nonce is empty and `ReplayGuard` refuses a
requester nonce seen before. The exchange and why: docs/security.md#the-handshake.
"""

import hashlib
import hmac
import secrets
import struct
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from radixmesh.common.secret import ClusterSecret, KeyPurpose
from radixmesh.proto.ids import NodeId
from radixmesh.proto.metadata.limits import check_node_id

NONCE_BYTES = 32
PROOF_BYTES = 32
MAX_HELLO_BYTES = 4 + 2 * 64 + NONCE_BYTES
_HELLO = struct.Struct("<BB")  # len(requester id), len(owner id); then the ids, then nonce_r


class HandshakeError(Exception):
    """The peer did not prove the identity it claims (or sent a malformed handshake message)."""


@dataclass(frozen=True, slots=True)
class Session:
    """An authenticated pair: `peer` proved its credential; `key` binds its pulls (transfer.binding)."""

    peer: NodeId
    key: bytes


def encode_hello(requester: NodeId, owner: NodeId, nonce: bytes) -> bytes:
    r, o = requester.encode(), owner.encode()
    return _HELLO.pack(len(r), len(o)) + r + o + nonce


def decode_hello(data: bytes) -> tuple[NodeId, NodeId, bytes]:
    """(requester, owner, nonce); HandshakeError when malformed."""
    if not _HELLO.size <= len(data) <= MAX_HELLO_BYTES:
        raise HandshakeError(f"hello of {len(data)} bytes")
    lr, lo = _HELLO.unpack_from(data)
    if len(data) != _HELLO.size + lr + lo + NONCE_BYTES:
        raise HandshakeError("hello fields do not add up")
    try:
        requester = NodeId(data[_HELLO.size : _HELLO.size + lr].decode())
        owner = NodeId(data[_HELLO.size + lr : _HELLO.size + lr + lo].decode())
        check_node_id(requester)
        check_node_id(owner)
    except ValueError as e:  # UnicodeDecodeError included
        raise HandshakeError(f"bad node id in hello: {e}") from None
    return requester, owner, data[-NONCE_BYTES:]


def _transcript(requester: NodeId, owner: NodeId, nonce_r: bytes, nonce_o: bytes) -> bytes:
    return encode_hello(requester, owner, nonce_r) + nonce_o


def _mac(key: bytes, role: bytes, transcript: bytes) -> bytes:
    return hmac.new(key, role + b"\x00" + transcript, hashlib.sha256).digest()


def _proof_key(secret: ClusterSecret, node: NodeId) -> bytes:
    return secret.key(KeyPurpose.TRANSFER_HANDSHAKE, node)


def _session_key(secret: ClusterSecret, owner: NodeId, transcript: bytes) -> bytes:
    return _mac(secret.key(KeyPurpose.TRANSFER_SESSION, owner), b"session", transcript)


class RequesterHandshake:
    """The requester's side towards one owner: `hello()`, then `answer(challenge)`."""

    def __init__(self, secret: ClusterSecret, me: NodeId, owner: NodeId,
                 nonce: Callable[[int], bytes] = secrets.token_bytes) -> None:
        self._secret = secret
        self._me = me
        self._owner = owner
        self._nonce_r = nonce(NONCE_BYTES)

    def hello(self) -> bytes:
        return encode_hello(self._me, self._owner, self._nonce_r)

    def answer(self, challenge: bytes) -> tuple[bytes, Session]:
        """Check the owner's proof in `challenge` (nonce_o ‖ proof); our proof and the session.
        HandshakeError when the owner does not hold the credential of the node we expect."""
        if len(challenge) != NONCE_BYTES + PROOF_BYTES:
            raise HandshakeError(f"challenge of {len(challenge)} bytes")
        nonce_o, proof = challenge[:NONCE_BYTES], challenge[NONCE_BYTES:]
        return self._finish(nonce_o, proof)

    def one_shot(self) -> bytes:
        """The Ray transport's hello and proof in one message (no owner nonce: see the module doc)."""
        t = _transcript(self._me, self._owner, self._nonce_r, b"")
        return self.hello() + _mac(_proof_key(self._secret, self._me), b"requester", t)

    def one_shot_session(self) -> Session:
        """The session of the one-shot transcript, before the owner proved anything: it seals the
        request that travels with `one_shot()`; check_owner() then authenticates it."""
        t = _transcript(self._me, self._owner, self._nonce_r, b"")
        return Session(self._owner, _session_key(self._secret, self._owner, t))

    def check_owner(self, proof: bytes) -> Session:
        """The Ray transport: check the owner's proof over the one-shot transcript."""
        return self._finish(b"", proof)[1]

    def _finish(self, nonce_o: bytes, proof: bytes) -> tuple[bytes, Session]:
        t = _transcript(self._me, self._owner, self._nonce_r, nonce_o)
        if not hmac.compare_digest(proof, _mac(_proof_key(self._secret, self._owner), b"owner", t)):
            raise HandshakeError(f"the peer does not hold the credential of node {self._owner}")
        mine = _mac(_proof_key(self._secret, self._me), b"requester", t)
        return mine, Session(self._owner, _session_key(self._secret, self._owner, t))


class OwnerHandshake:
    """The owner's side of one connection: `challenge(hello)`, then `verify(proof)`."""

    def __init__(self, secret: ClusterSecret, me: NodeId,
                 nonce: Callable[[int], bytes] = secrets.token_bytes) -> None:
        self._secret = secret
        self._me = me
        self._nonce = nonce
        self._transcript = b""
        self._requester = NodeId("")

    def challenge(self, hello: bytes) -> bytes:
        """nonce_o ‖ our proof; HandshakeError when the hello is malformed or names another owner."""
        requester, nonce_r = self._accept_hello(hello)
        nonce_o = self._nonce(NONCE_BYTES)
        self._transcript = _transcript(requester, self._me, nonce_r, nonce_o)
        return nonce_o + self._proof()

    def verify(self, proof: bytes) -> Session:
        """The session once the requester proved its credential; HandshakeError otherwise."""
        assert self._transcript, "challenge() first"
        expected = _mac(_proof_key(self._secret, self._requester), b"requester", self._transcript)
        if not hmac.compare_digest(proof, expected):
            raise HandshakeError(f"the requester does not hold the credential of node {self._requester}")
        return Session(self._requester, _session_key(self._secret, self._me, self._transcript))

    def one_shot(self, message: bytes, guard: "ReplayGuard") -> tuple[bytes, Session]:
        """The Ray transport: check a requester's one-shot hello ‖ proof; our proof and the session."""
        hello, proof = message[:-PROOF_BYTES], message[-PROOF_BYTES:]
        requester, nonce_r = self._accept_hello(hello)
        self._transcript = _transcript(requester, self._me, nonce_r, b"")
        session = self.verify(proof)
        if not guard.first_use(nonce_r):
            raise HandshakeError("replayed request")
        return self._proof(), session

    def _accept_hello(self, hello: bytes) -> tuple[NodeId, bytes]:
        requester, owner, nonce_r = decode_hello(hello)
        if owner != self._me:
            raise HandshakeError(f"this is node {self._me}, not {owner}")
        self._requester = requester
        return requester, nonce_r

    def _proof(self) -> bytes:
        return _mac(_proof_key(self._secret, self._me), b"owner", self._transcript)


class ReplayGuard:
    """Requester nonces seen in the last `ttl_s` (at most `capacity`, oldest forgotten first)."""

    def __init__(self, capacity: int = 65536, ttl_s: float = 600.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._seen: OrderedDict[bytes, float] = OrderedDict()
        self._capacity = capacity
        self._ttl_s = ttl_s
        self._clock = clock

    def first_use(self, nonce: bytes) -> bool:
        now = self._clock()
        while self._seen and (len(self._seen) >= self._capacity or next(iter(self._seen.values())) < now - self._ttl_s):
            self._seen.popitem(last=False)
        if nonce in self._seen:
            return False
        self._seen[nonce] = now
        return True


@dataclass(frozen=True, slots=True)
class NodeIdentity:
    """Who this node is on the transfer plane: its id and the secret its credential derives from."""

    secret: ClusterSecret
    node_id: NodeId
