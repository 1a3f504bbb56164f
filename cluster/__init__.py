"""radixmesh.cluster."""
