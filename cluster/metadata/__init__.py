"""The global metadata service: index, membership and leases, hit accounting, state stores, gRPC server."""
