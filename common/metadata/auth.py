"""How a metadata RPC says who calls: gRPC metadata `authorization: Bearer <token>`, plus
`x-radixmesh-node: <node id>` when a node calls.

    cluster caller (router, operator)   token = ClusterSecret.metadata_token()
    node caller                         token = hex(ClusterSecret.node_credential(node))

Node-scoped RPCs (register, heartbeat, publish, snapshot) must come from the node they name; a
bearer token on the wire is what gRPC offers (TLS protects it from eavesdroppers, see
docs/security.md); a stolen node token speaks for that node only, never for the cluster or another node.
"""

from dataclasses import dataclass

from radixmesh.common.secret import ClusterSecret
from radixmesh.proto.ids import NodeId

TOKEN_METADATA_KEY = "authorization"
NODE_METADATA_KEY = "x-radixmesh-node"


def bearer(token: str) -> str:
    """The metadata value carrying `token`."""
    return f"Bearer {token}"


@dataclass(frozen=True, slots=True)
class CallerCredentials:
    """The gRPC metadata one client attaches to every call; `NO_CREDENTIALS` sends none."""

    metadata: tuple[tuple[str, str], ...] = ()

    @classmethod
    def cluster(cls, secret: ClusterSecret) -> "CallerCredentials":
        return cls(((TOKEN_METADATA_KEY, bearer(secret.metadata_token())),))

    @classmethod
    def node(cls, secret: ClusterSecret, node: NodeId) -> "CallerCredentials":
        token = secret.node_credential(node).hex()
        return cls(((TOKEN_METADATA_KEY, bearer(token)), (NODE_METADATA_KEY, node)))

    def __repr__(self) -> str:
        return f"CallerCredentials({[k for k, _ in self.metadata]})"


NO_CREDENTIALS = CallerCredentials()
