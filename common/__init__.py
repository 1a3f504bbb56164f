"""What node agents and the cluster share: the block pool and prefix cache (the torch-free cache core),
metrics, text, the metadata client, the secret."""

from radixmesh.import_name import step_aside

step_aside(__name__)  # importable only as radixmesh.common (radixmesh/import_name.py)
