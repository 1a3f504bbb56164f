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
    pid_start: int | None = None
    """When `pid` started (`process_start`): `down` signals `pid` only while its start time is still
    this one, so a pid that `up` left and another process took is never signalled."""


def record_path() -> Path:
    return Path(os.environ.get("RADIXMESH_HOME", Path.home() / ".radixmesh")) / "cluster.json"


def ca_file_path() -> Path:
    """Where `up` writes the CA certificate its servers' TLS certificates verify against (launch.tls);
    `radixmesh stats` and `route` trust it."""
    return record_path().parent / "tls" / "ca.pem"


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


def running_since(pid: int) -> int | None:
    """When the process running under `pid` started, in clock ticks since boot (/proc/PID/stat field
    22, starttime); None when none runs there (no such pid, or one that exited and awaits its parent:
    a zombie) or there is no procfs to ask. A pid is reused, a (pid, start) pair is not: a process
    that takes a freed pid starts later."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Fields 3 on follow the command name, which may hold spaces and ")" itself: split after its last ")".
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] == "Z" else int(fields[19])
