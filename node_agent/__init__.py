"""radixmesh.node_agent."""
