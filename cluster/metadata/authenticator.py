"""Who is calling the metadata service: the cluster (router, operator) or one node, proven by the
tokens of common.metadata.auth. A node may call only the RPCs of its own node; the cluster-scoped
RPCs only the cluster. A service without a secret (loopback development only, see
server.ServerOptions) admits every caller as the cluster and checks no node scope."""

import hmac
from collections.abc import Iterable
from dataclasses import dataclass

from radixmesh.common.metadata.auth import NODE_METADATA_KEY, TOKEN_METADATA_KEY, cluster_bearer, node_bearer
from radixmesh.common.secret import ClusterSecret
from radixmesh.proto.ids import NodeId


@dataclass(frozen=True, slots=True)
class Caller:
    node: NodeId | None
    """The node whose credential the call carried; None for a cluster caller."""

    @property
    def is_cluster(self) -> bool:
        """The cluster principal (a router, an operator; every caller of an open service): the only
        caller of the cluster-scoped RPCs, which read every node's state or steer every router."""
        return self.node is None

    def may_speak_for(self, node: str, open_service: bool) -> bool:
        """Whether this caller may act as `node` (register it, renew its lease, publish its events)."""
        return open_service or self.node == node


class Authenticator:
    """Maps a call's gRPC metadata to a Caller, or None when its credential is missing or wrong."""

    def __init__(self, secret: ClusterSecret | None) -> None:
        self._secret = secret
        self._cluster = cluster_bearer(secret).encode() if secret is not None else b""

    @property
    def open(self) -> bool:
        """No secret: every call is admitted."""
        return self._secret is None

    def authenticate(self, metadata: Iterable[tuple[str, str | bytes]] | None) -> Caller | None:
        if self._secret is None:
            return Caller(None)
        fields = {k: v.encode() if isinstance(v, str) else v for k, v in metadata or ()}
        given = fields.get(TOKEN_METADATA_KEY, b"")
        node_raw = fields.get(NODE_METADATA_KEY)
        if node_raw is None:
            return Caller(None) if hmac.compare_digest(given, self._cluster) else None
        try:
            node = NodeId(node_raw.decode())
            expected = node_bearer(self._secret, node).encode()  # ValueError for an invalid node id
        except ValueError:  # UnicodeDecodeError included
            return None
        return Caller(node) if hmac.compare_digest(given, expected) else None
