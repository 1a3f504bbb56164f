"""radixmesh.proto.serve"""
