"""radixmesh.node_agent.model.llama"""
