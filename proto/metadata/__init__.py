"""radixmesh.proto.metadata"""
