"""The one way to regenerate proto/*_pb2*.py from radixmesh.proto: `python proto/generate.py`.

protoc runs with the include path `radixmesh/proto=proto`, so the generated modules import each other
as `radixmesh.proto.radixmesh_pb2`, which the package mapping resolves; nothing is hand-patched.
`--check` exits non-zero when the committed files differ from what protoc writes now.
"""

import argparse
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

PROTO_DIR = Path(__file__).resolve().parent
GENERATED = ("radixmesh_pb2.py", "radixmesh_pb2_grpc.py", "radixmesh_pb2.pyi")


def generate() -> dict[str, bytes]:
    """Run protoc on radixmesh.proto in a scratch folder; return the generated files by name."""
    with tempfile.TemporaryDirectory() as tmp:
        rc = protoc.main(
            [
                "grpc_tools.protoc",
                f"-Iradixmesh/proto={PROTO_DIR}",
                f"--python_out={tmp}",
                f"--grpc_python_out={tmp}",
                f"--pyi_out={tmp}",
                "radixmesh/proto/radixmesh.proto",
            ]
        )
        if rc != 0:
            raise RuntimeError(f"protoc failed with exit code {rc}")
        out = Path(tmp) / "radixmesh" / "proto"
        return {name: (out / name).read_bytes() for name in GENERATED}


def stale_files() -> list[str]:
    """Names of committed generated files that differ from a fresh protoc run."""
    fresh = generate()
    return [n for n, data in fresh.items() if not (PROTO_DIR / n).is_file() or (PROTO_DIR / n).read_bytes() != data]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="only report stale files")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_files()
        if stale:
            print(f"stale generated files: {', '.join(stale)}; run python proto/generate.py")
            return 1
        return 0
    for name, data in generate().items():
        (PROTO_DIR / name).write_bytes(data)
        print(f"wrote proto/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
