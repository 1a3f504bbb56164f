"""The committed generated protobuf code is exactly what proto/generate.py writes now."""

from radixmesh.proto import generate


def test_generated_code_is_current() -> None:
    stale = generate.stale_files()
    assert stale == [], f"stale generated files {stale}: run python proto/generate.py"


def test_generated_modules_import_through_the_package() -> None:
    from radixmesh.proto import radixmesh_pb2, radixmesh_pb2_grpc

    assert radixmesh_pb2.DESCRIPTOR.package == "radixmesh.v1"
    assert hasattr(radixmesh_pb2_grpc, "MetadataServiceStub")
