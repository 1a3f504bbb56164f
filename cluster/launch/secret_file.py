"""Where a deployment's cluster secret comes from: `--secret-file`, `RADIXMESH_SECRET` (hex), or
$RADIXMESH_HOME/secret, which `radixmesh up` creates (mode 0600) when none of them is given.

The file holds the secret as hex on one line. A file that other users can read is refused: the
secret speaks for every node of the cluster.
"""

import os
import stat
from pathlib import Path

from radixmesh.cluster.launch.cluster_record import record_path
from radixmesh.common.secret import ClusterSecret

SECRET_ENV = "RADIXMESH_SECRET"


def default_secret_path() -> Path:
    return record_path().parent / "secret"


def read_secret(path: Path) -> ClusterSecret:
    """The secret in `path`; ValueError when it is missing, readable by others, or not a secret."""
    try:
        mode = path.stat().st_mode
        text = path.read_text()
    except OSError as e:
        raise ValueError(f"cannot read the cluster secret {path}: {e.strerror}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ValueError(f"{path} is accessible to other users (mode {stat.S_IMODE(mode):o}); "
                         f"`chmod 600 {path}`")
    try:
        return ClusterSecret.from_hex(text)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


def create_secret(path: Path) -> ClusterSecret:
    """A new secret written to `path` (created 0600, never overwriting); FileExistsError if it exists."""
    secret = ClusterSecret.generate()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret.to_hex() + "\n")
    return secret


def given_secret(secret_file: Path | None) -> ClusterSecret | None:
    """The secret the operator gave (flag first, then RADIXMESH_SECRET), or None. ValueError when the
    one given cannot be used."""
    if secret_file is not None:
        return read_secret(secret_file)
    text = os.environ.get(SECRET_ENV)
    if text is None:
        return None
    try:
        return ClusterSecret.from_hex(text)
    except ValueError as e:
        raise ValueError(f"{SECRET_ENV}: {e}") from None


def deployment_secret(secret_file: Path | None) -> ClusterSecret:
    """What `up` runs with: the given secret, else $RADIXMESH_HOME/secret, made on first use."""
    given = given_secret(secret_file)
    if given is not None:
        return given
    path = default_secret_path()
    if path.exists():
        return read_secret(path)
    return create_secret(path)
