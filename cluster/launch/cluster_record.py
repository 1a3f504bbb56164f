"""What `radixmesh up` leaves behind for `down`, `route` and `stats`: a small JSON record at
$RADIXMESH_HOME/cluster.json (default ~/.radixmesh/cluster.json)."""

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class ClusterRecord:
    router_url: str
    metadata_address: str
    ray_address: str | None = None
    """The Ray cluster the detached actors live on (`up` joined an existing one)."""
    pid: int | None = None
    """The foreground `up --local` process that owns a local Ray; `down` sends it SIGTERM."""


def record_path() -> Path:
    return Path(os.environ.get("RADIXMESH_HOME", Path.home() / ".radixmesh")) / "cluster.json"


def save(record: ClusterRecord) -> None:
    path = record_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(record), indent=1))


def load() -> ClusterRecord | None:
    """The record of the running deployment, or None; ValueError for a corrupt file."""
    path = record_path()
    if not path.exists():
        return None
    try:
        return ClusterRecord(**json.loads(path.read_text()))
    except (json.JSONDecodeError, TypeError) as e:
        raise ValueError(f"{path} is not a radixmesh cluster record ({e}); delete it") from e


def remove() -> None:
    record_path().unlink(missing_ok=True)
