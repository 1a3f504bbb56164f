"""The cluster secret and every key derived from it.

One random secret per deployment (`radixmesh up` makes it, docs/security.md); each use gets its own
key, derived as HMAC-SHA256(secret, "radixmesh\\0" ‖ label), so no key can be turned into another or
back into the secret:

    metadata_token()        what the router and operators send to the metadata service
    node_credential(node)   a node's identity: metadata RPCs of that node and the transfer handshake
    hash_key()              the block-hash key (a prefix's hash cannot be computed outside the cluster)

Node credentials are derivable by any holder of the secret: they name which node speaks (a node's
lease cannot be taken over by another host), they do not isolate nodes from each other.
"""

import hashlib
import hmac
import ipaddress
import secrets
from dataclasses import dataclass

from radixmesh.proto.ids import NodeId

SECRET_BYTES = 32
"""Length of a generated secret (and the least accepted: 256 bits)."""
_DOMAIN = b"radixmesh\x00"


@dataclass(frozen=True, slots=True)
class ClusterSecret:
    """The shared secret; its repr never shows the value (it ends up in logs and Ray's task specs)."""

    value: bytes

    def __post_init__(self) -> None:
        if len(self.value) < SECRET_BYTES:
            raise ValueError(f"a cluster secret has at least {SECRET_BYTES} bytes, got {len(self.value)}")

    @classmethod
    def generate(cls) -> "ClusterSecret":
        return cls(secrets.token_bytes(SECRET_BYTES))

    @classmethod
    def from_hex(cls, text: str) -> "ClusterSecret":
        """Parse the file/env form (hex, surrounding whitespace ignored); ValueError otherwise."""
        try:
            return cls(bytes.fromhex(text.strip()))
        except ValueError as e:
            raise ValueError(f"a cluster secret is {2 * SECRET_BYTES}+ hex digits: {e}") from None

    def to_hex(self) -> str:
        return self.value.hex()

    def derive(self, label: bytes) -> bytes:
        """The 32-byte key for `label`; distinct labels give independent keys."""
        return hmac.new(self.value, _DOMAIN + label, hashlib.sha256).digest()

    def metadata_token(self) -> str:
        """Bearer token of cluster-scoped metadata RPCs (Match, GetStats)."""
        return self.derive(b"metadata-token").hex()

    def node_credential(self, node: NodeId) -> bytes:
        """The identity key of `node`: proves "I am `node`" without being sent (transfer handshake)."""
        return self.derive(b"node\x00" + node.encode())

    def hash_key(self) -> bytes:
        """Key of the block hashes (BLAKE2b keyed mode)."""
        return self.derive(b"block-hash-key")

    def __repr__(self) -> str:
        return "ClusterSecret(<hidden>)"


def is_loopback(host: str) -> bool:
    """True for addresses only this machine reaches (127.0.0.0/8, ::1, localhost)."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def check_bind(component: str, host: str, secret: ClusterSecret | None) -> None:
    """ValueError when `component` would serve a non-loopback address without a secret: a port that
    other hosts reach is never opened unauthenticated."""
    if secret is None and not is_loopback(host):
        raise ValueError(f"{component} refuses to bind {host!r} without a cluster secret "
                         "(--secret-file or RADIXMESH_SECRET); only loopback addresses may run without one")
