"""radixmesh.node_agent.memory"""
