"""Cluster-wide parts: metadata service, routing policies, router, simulator, launcher, CLI."""
