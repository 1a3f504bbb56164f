"""The contract layer: every type that crosses a process boundary, and the wire schema."""

from radixmesh.import_name import step_aside

step_aside(__name__)  # importable only as radixmesh.proto (radixmesh/import_name.py)
