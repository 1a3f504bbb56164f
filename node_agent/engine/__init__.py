"""radixmesh.node_agent.engine.engine"""
