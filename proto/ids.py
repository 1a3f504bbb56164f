"""Identifiers shared by the node agent and the cluster, typed so roles cannot be swapped."""

from typing import NewType

BlockId = NewType("BlockId", int)
"""Index of a physical block inside one tier's pool."""

NodeId = NewType("NodeId", str)
"""Stable name of one node agent (one GPU)."""
