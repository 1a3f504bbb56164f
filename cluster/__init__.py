"""Cluster-wide parts: metadata service, routing policies, router, simulator, launcher, CLI."""

from radixmesh.import_name import step_aside

step_aside(__name__)  # importable only as radixmesh.cluster (radixmesh/import_name.py)
