"""radixmesh.kernels."""
