"""Identifiers shared by the node agent and the cluster, typed so roles cannot be swapped."""

from typing import NewType

BlockId = NewType("BlockId", int)
"""Index of a physical block inside one tier's pool."""

NodeId = NewType("NodeId", str)
"""Stable name of one node agent (one GPU)."""


def agent_actor_name(node: NodeId) -> str:
    """The Ray actor name of `node`'s agent: the launcher creates it, the router finds it by this name
    (ray.get_actor)."""
    return f"radixmesh-agent-{node}"
