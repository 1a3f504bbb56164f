"""radixmesh.proto."""
