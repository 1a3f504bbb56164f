"""radixmesh.cluster.router.router"""
