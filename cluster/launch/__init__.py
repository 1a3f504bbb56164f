"""radixmesh.cluster.launch"""
