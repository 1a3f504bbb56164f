"""The routing tests' node views and prices: a small configuration whose every figure is a round
number, so each expected estimate can be written by hand."""

from radixmesh.cluster.policy.base import PolicyConfig, RouteRequest
from radixmesh.cluster.policy.view import NodeView
from radixmesh.proto.ids import NodeId

# 1 s per host block, free pulls apart from bandwidth (1 ms a block unless a pair measured another);
# 10-token blocks at 100 tokens/s = 0.1 s a block.
# Steps of 10 tokens (0.1 s at 100 tokens/s).
CFG = PolicyConfig(block_bytes=1000, host_bytes_per_s=1000.0, pull_latency_s=0.0, pull_bytes_per_s=1e6, step_tokens=10)
REQ = RouteRequest(prompt_tokens=50, num_blocks=5, block_tokens=10)
A, B, C, D = (NodeId(x) for x in "abcd")


def view(
    node: NodeId,
    local: int = 0,
    *,
    gpu: int | None = None,
    queued: int = 0,
    inflight: int = 0,
    recent: float = 0.0,
    held: int | None = None,
    decodes: int = 0,
    group: str = "",
) -> NodeView:
    """A node at 100 tokens/s whose local prefix is computed (`held`) unless told otherwise."""
    return NodeView(node, local if gpu is None else gpu, local, queued, inflight, 100.0, recent,
                    local if held is None else held, decodes, 0.0, group)
