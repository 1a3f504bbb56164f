"""The cluster secret and every key derived from it.

One random secret per deployment (`radixmesh up` makes it, docs/security.md); each use gets its own
key, `ClusterSecret.key(purpose, node)`, derived as HMAC-SHA256(secret, "radixmesh\\0" ‖ label [‖ "\\0" ‖
node]). Labels hold no NUL and node ids are checked, so distinct (purpose, node) pairs give independent
keys: no key can be turned into another or back into the secret, and a token seen on the wire (a
metadata bearer token, a scrape token) opens nothing but what its purpose names.

Per-node keys are derivable by any holder of the secret: they name which node speaks (a node's
lease cannot be taken over by another host), they do not isolate nodes from each other.
"""

import hashlib
import hmac
import ipaddress
import secrets
from dataclasses import dataclass
from enum import Enum, unique

from radixmesh.proto.ids import NodeId
from radixmesh.proto.metadata.limits import check_node_id

SECRET_BYTES = 32
"""Length of a generated secret (and the least accepted: 256 bits)."""
_DOMAIN = b"radixmesh\x00"


@unique
class KeyPurpose(Enum):
    """What a derived key is for; the value is its label. The labels of purposes that never shared a
    key are those of earlier versions, so block hashes and scrape tokens did not change."""

    BLOCK_HASH = b"block-hash-key"
    """Keys the block hashes (BLAKE2b keyed mode): a prefix's hash cannot be computed outside the cluster."""
    METADATA_CLUSTER = b"metadata-token"
    """Bearer token of the cluster principal (routers, operators) on the metadata service."""
    METADATA_NODE = b"metadata-node"
    """Per node: its bearer token on the metadata service's node-scoped RPCs (seen on the wire without TLS)."""
    TRANSFER_HANDSHAKE = b"transfer-handshake"
    """Per node: proves "I am this node" in the transfer handshake; never sent."""
    TRANSFER_SESSION = b"transfer-session"
    """Per node (the owner of a pull): keys the session key of each handshake, hence the chunk MACs."""
    METRICS_SCRAPE = b"metrics-token"
    """Bearer token of agents' /metrics off loopback (Prometheus' credentials file)."""
    HTTP_ADMIN = b"http-admin-key"
    """Bearer token of the router's admin endpoints (prefix-cache reset, per-tenant /stats)."""
    TLS_CA = b"tls-ca-key"
    """Seeds the cluster CA's private key (common.cluster_ca): whoever holds the secret can mint certificates."""
    KV_EVENTS_SERVER = b"kv-events-server"
    """Seeds the CURVE key pair of agents' KV-events sockets over tcp (common.kv_events_curve)."""
    KV_EVENTS_CLIENT = b"kv-events-client"
    """Seeds the one CURVE key pair those sockets accept subscribers with."""

    @property
    def per_node(self) -> bool:
        return self in _PER_NODE


_PER_NODE = frozenset({KeyPurpose.METADATA_NODE, KeyPurpose.TRANSFER_HANDSHAKE, KeyPurpose.TRANSFER_SESSION})


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

    def key(self, purpose: KeyPurpose, node: NodeId | None = None) -> bytes:
        """The 32-byte key of `purpose`, of `node` for a per-node purpose. ValueError when `node` is
        missing for a per-node purpose, given for a cluster-wide one, or not a valid node id."""
        if purpose.per_node != (node is not None):
            raise ValueError(f"key {purpose.name} is {'per node' if purpose.per_node else 'cluster-wide'}, "
                             f"got node {node!r}")
        label = purpose.value
        if node is not None:
            check_node_id(node)
            label += b"\x00" + node.encode()
        return hmac.new(self.value, _DOMAIN + label, hashlib.sha256).digest()

    def hash_key(self) -> bytes:
        """Key of the block hashes (the engines' configs take it as bytes)."""
        return self.key(KeyPurpose.BLOCK_HASH)

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


def check_api_bind(host: str, api_key: str) -> None:
    """ValueError when the router's HTTP API would serve `host` ("": every address) beyond loopback
    without an API key: whoever reaches it could use the model, /stats and /metrics (issue 38)."""
    if not api_key and not is_loopback(host):
        raise ValueError(f"the OpenAI API refuses to serve {host or 'every address'!r} without an API key: only "
                         "loopback may go keyless; give --api-key (or RADIXMESH_API_KEY), or bind 127.0.0.1")
