"""What node agents and the cluster share: metrics, text, the metadata client, recall, the secret."""

from radixmesh.import_name import step_aside

step_aside(__name__)  # importable only as radixmesh.common (radixmesh/import_name.py)
