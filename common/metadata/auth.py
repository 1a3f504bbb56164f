"""How a metadata RPC says who calls: gRPC metadata `authorization: Bearer <token>`, plus
`x-radixmesh-node: <node id>` when a node calls.

    cluster caller (router, operator)   token = hex(key(METADATA_CLUSTER))
    node caller                         token = hex(key(METADATA_NODE, node))

Node-scoped RPCs (register, heartbeat, publish, snapshot) must come from the node they name;
cluster-scoped ones (Match, GetStats, WatchIndex, ReportPredictions) from the cluster principal. A
bearer token on the wire is what gRPC offers (TLS protects it from eavesdroppers, see
docs/security.md); a stolen node token speaks for that node on the metadata service only: not for the
cluster, another node, or that node on the transfer plane (whose keys are other purposes').
"""

from dataclasses import dataclass

from radixmesh.common.secret import ClusterSecret, KeyPurpose
from radixmesh.proto.ids import NodeId

TOKEN_METADATA_KEY = "authorization"
NODE_METADATA_KEY = "x-radixmesh-node"


def cluster_bearer(secret: ClusterSecret) -> str:
    """The `authorization` value of the cluster principal."""
    return f"Bearer {secret.key(KeyPurpose.METADATA_CLUSTER).hex()}"


def node_bearer(secret: ClusterSecret, node: NodeId) -> str:
    """The `authorization` value of `node` (ValueError for an invalid node id)."""
    return f"Bearer {secret.key(KeyPurpose.METADATA_NODE, node).hex()}"


@dataclass(frozen=True, slots=True)
class CallerCredentials:
    """The gRPC metadata one client attaches to every call; `NO_CREDENTIALS` sends none."""

    metadata: tuple[tuple[str, str], ...] = ()

    @classmethod
    def cluster(cls, secret: ClusterSecret) -> "CallerCredentials":
        return cls(((TOKEN_METADATA_KEY, cluster_bearer(secret)),))

    @classmethod
    def node(cls, secret: ClusterSecret, node: NodeId) -> "CallerCredentials":
        return cls(((TOKEN_METADATA_KEY, node_bearer(secret, node)), (NODE_METADATA_KEY, node)))

    def __repr__(self) -> str:
        return f"CallerCredentials({[k for k, _ in self.metadata]})"


NO_CREDENTIALS = CallerCredentials()
