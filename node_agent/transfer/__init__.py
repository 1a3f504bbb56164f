"""radixmesh.node_agent.transfer"""
