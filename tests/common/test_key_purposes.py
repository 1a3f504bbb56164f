"""One key per purpose: what an eavesdropper reads on the wire without TLS (a node's metadata bearer
token in every heartbeat, the metrics scrape token, the handshake's nonces) opens nothing of another
purpose. The attacks run against the real transfer handshake; the attacker knows the protocol and
tries the stolen token as the key it used to be (hex-decoded, and as sent)."""

import hashlib
import hmac

import pytest

from radixmesh.cluster.api.admin import admin_key
from radixmesh.common.metadata.auth import TOKEN_METADATA_KEY, CallerCredentials
from radixmesh.common.metrics.scrape import metrics_token
from radixmesh.common.secret import ClusterSecret, KeyPurpose
from radixmesh.node_agent.transfer.handshake import (
    NONCE_BYTES,
    HandshakeError,
    OwnerHandshake,
    RequesterHandshake,
    encode_hello,
)
from radixmesh.proto.ids import NodeId

SECRET = ClusterSecret(bytes(range(32)))
A, B = NodeId("node-1"), NodeId("node-2")


def sniffed_bearer(node: NodeId) -> str:
    """The token a heartbeat of `node` shows on the wire (`authorization: Bearer <token>`)."""
    value = dict(CallerCredentials.node(SECRET, node).metadata)[TOKEN_METADATA_KEY]
    return value.removeprefix("Bearer ")


def guesses(token: str) -> list[bytes]:
    """Keys an attacker holding only `token` tries."""
    return [bytes.fromhex(token), token.encode()]


def role_mac(key: bytes, role: bytes, transcript: bytes) -> bytes:
    """The handshake's proof over `transcript` for `role`, as the protocol writes it (module doc)."""
    return hmac.new(key, role + b"\x00" + transcript, hashlib.sha256).digest()


@pytest.mark.parametrize("guess", range(2))
def test_a_sniffed_metadata_token_does_not_pass_the_handshake_as_requester(guess: int) -> None:
    key = guesses(sniffed_bearer(A))[guess]
    hello = encode_hello(A, B, bytes(NONCE_BYTES))  # the attacker's, in node-1's name
    owner = OwnerHandshake(SECRET, B)
    nonce_o = owner.challenge(hello)[:NONCE_BYTES]
    with pytest.raises(HandshakeError, match="does not hold the credential of node node-1"):
        owner.verify(role_mac(key, b"requester", hello + nonce_o))


@pytest.mark.parametrize("guess", range(2))
def test_a_sniffed_metadata_token_does_not_pass_the_handshake_as_owner(guess: int) -> None:
    key = guesses(sniffed_bearer(B))[guess]
    requester = RequesterHandshake(SECRET, A, B)
    hello = requester.hello()
    nonce_o = bytes(NONCE_BYTES)
    with pytest.raises(HandshakeError, match="does not hold the credential of node node-2"):
        requester.answer(nonce_o + role_mac(key, b"owner", hello + nonce_o))


def test_the_session_key_is_not_computable_from_the_sniffed_tokens_and_transcript() -> None:
    requester = RequesterHandshake(SECRET, A, B)
    owner = OwnerHandshake(SECRET, B)
    hello = requester.hello()
    challenge = owner.challenge(hello)
    proof, session = requester.answer(challenge)
    assert owner.verify(proof).key == session.key  # the honest pair agrees
    transcript = hello + challenge[:NONCE_BYTES]  # all an eavesdropper needs besides a key
    for token in (sniffed_bearer(A), sniffed_bearer(B), metrics_token(SECRET)):
        for key in guesses(token):
            assert role_mac(key, b"session", transcript) != session.key


def test_no_token_sent_on_the_wire_is_a_key_kept_secret() -> None:
    sent = {sniffed_bearer(A), sniffed_bearer(B), metrics_token(SECRET), admin_key(SECRET),
            dict(CallerCredentials.cluster(SECRET).metadata)[TOKEN_METADATA_KEY].removeprefix("Bearer ")}
    kept = {SECRET.value, SECRET.hash_key(),
            *(SECRET.key(p, n) for p in (KeyPurpose.TRANSFER_HANDSHAKE, KeyPurpose.TRANSFER_SESSION) for n in (A, B))}
    assert not {k for t in sent for k in guesses(t)} & kept


def test_every_purpose_and_node_has_its_own_key() -> None:
    keys = [SECRET.key(p, n) for p in KeyPurpose if p.per_node for n in (A, B)]
    keys += [SECRET.key(p) for p in KeyPurpose if not p.per_node]
    assert len(set(keys)) == len(keys) == 3 * 2 + 7
    assert all(len(k) == 32 and k != SECRET.value for k in keys)
    other = ClusterSecret(bytes(range(1, 33)))
    assert not set(keys) & {other.key(p, A if p.per_node else None) for p in KeyPurpose}


def test_block_hashes_and_scrape_tokens_keep_their_earlier_labels() -> None:
    """Purposes that never shared a key keep their key: a saved index's hashes and Prometheus'
    credentials file survive the upgrade."""
    def earlier(label: bytes) -> bytes:
        return hmac.new(SECRET.value, b"radixmesh\x00" + label, hashlib.sha256).digest()

    assert SECRET.hash_key() == earlier(b"block-hash-key")
    assert metrics_token(SECRET) == earlier(b"metrics-token").hex()


@pytest.mark.parametrize(("purpose", "node", "error"), [
    (KeyPurpose.TRANSFER_HANDSHAKE, None, "TRANSFER_HANDSHAKE is per node"),
    (KeyPurpose.METADATA_CLUSTER, A, "METADATA_CLUSTER is cluster-wide"),
    (KeyPurpose.METADATA_NODE, NodeId("a\x00b"), "node id must be"),
    (KeyPurpose.METADATA_NODE, NodeId(""), "node id must be"),
])
def test_a_key_asked_for_the_wrong_scope_is_refused(purpose: KeyPurpose, node: NodeId | None, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        SECRET.key(purpose, node)
