"""radixmesh.cluster.metadata"""
