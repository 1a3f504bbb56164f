"""Where a deployment's cluster secret comes from: `--secret-file`, `RADIXMESH_SECRET` (hex), or
$RADIXMESH_HOME/secret, which `radixmesh up` creates (mode 0600) when none of them is given.

The file holds the secret as hex on one line. A file that other users can read is refused: the
secret speaks for every node of the cluster.

Actors never receive the secret: Ray keeps an actor's constructor arguments in its GCS, where
anyone who reaches Ray (or its dashboard) reads them. They get a NodeSecret, which says where the
secret is on the node they run on (the same file, or RADIXMESH_SECRET in the environment Ray's
workers inherit from `ray start`), and a fingerprint that proves they found the one `up` runs with.
The router's API key and the TLS private key go the same way: `up` writes each to a 0600 file under
$RADIXMESH_HOME on the head (where those actors run) and the actors get a NodeKey, the file's path.
"""

import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from radixmesh.cluster.launch.cluster_record import record_path
from radixmesh.cluster.metadata.server import TlsFiles
from radixmesh.common.private_files import replace_atomically, write_new
from radixmesh.common.secret import ClusterSecret

SECRET_ENV = "RADIXMESH_SECRET"


def default_secret_path() -> Path:
    return record_path().parent / "secret"


def read_private(path: Path) -> str:
    """The text of `path`; ValueError when it is missing or readable by other users."""
    try:
        mode = path.stat().st_mode
        text = path.read_text()
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e.strerror}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ValueError(f"{path} is accessible to other users (mode {stat.S_IMODE(mode):o}); "
                         f"`chmod 600 {path}`")
    return text


def write_private(path: Path, text: str) -> None:
    """Write `text` to a new file `path`, mode 0600 from its creation (its folder 0700 if made);
    FileExistsError if it (or a link) exists."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_new(path, (text + "\n").encode())


def read_secret(path: Path) -> ClusterSecret:
    """The secret in `path`; ValueError when it is missing, readable by others, or not a secret."""
    try:
        text = read_private(path)
    except ValueError as e:
        raise ValueError(f"the cluster secret: {e}") from None
    try:
        return ClusterSecret.from_hex(text)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


def create_secret(path: Path) -> ClusterSecret:
    """A new secret written to `path` (created 0600, never overwriting); FileExistsError if it exists."""
    secret = ClusterSecret.generate()
    write_private(path, secret.to_hex())
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


def node_secret(secret_file: Path | None) -> ClusterSecret:
    """The secret as `up` found it (flag, RADIXMESH_SECRET, default file), looked up on this node and
    never made here; ValueError when there is none."""
    given = given_secret(secret_file)
    return given if given is not None else read_secret(default_secret_path())


def fingerprint(secret: ClusterSecret) -> str:
    """A short one-way name of `secret` (hash of a derived key): tells two secrets apart, opens nothing."""
    return hashlib.sha256(b"radixmesh-secret-fingerprint\x00" + secret.hash_key()).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class NodeSecret:
    """What an actor is given in place of the cluster secret: where to find it on its own node, and
    the fingerprint of the one the deployment runs with. Calling it loads and checks the secret."""

    secret_file: Path | None
    """`up --secret-file` (the same path on every node); None: RADIXMESH_SECRET, else
    $RADIXMESH_HOME/secret of the user Ray runs as."""
    fingerprint: str

    @classmethod
    def of(cls, secret: ClusterSecret, secret_file: Path | None) -> "NodeSecret":
        return cls(secret_file, fingerprint(secret))

    def __call__(self) -> ClusterSecret:
        """The secret on this node; ValueError when it is missing, unsafe, or not the deployment's."""
        secret = node_secret(self.secret_file)
        if fingerprint(secret) != self.fingerprint:
            raise ValueError(f"the cluster secret on this node ({self.secret_file or default_secret_path()} or "
                             f"${SECRET_ENV}) is not the one `radixmesh up` runs with: give every node the same")
        return secret


def stage_private(path: Path, text: str) -> None:
    """`path` holds `text`, mode 0600: left as it is when it already does (the API key file the deploy
    YAMLs make), else replaced at once (a reader never sees a partial or shared file)."""
    try:
        if read_private(path) == text + "\n":
            return
    except ValueError:
        pass  # missing, shared or unreadable: replaced below
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    replace_atomically(path, (text + "\n").encode())


@dataclass(frozen=True, slots=True)
class NodeKey:
    """What an actor is given in place of a private key (the HTTP API key, the TLS private key): the
    0600 file that holds it on the node the actor runs on. Calling it loads the key."""

    path: Path
    what: str
    """What the key is, for the error an actor refuses to start with."""

    @classmethod
    def staged(cls, path: Path, key: str, what: str) -> "NodeKey":
        """The loader of `key`, written (0600) to `path` on this node first: the actor must run here."""
        stage_private(path.absolute(), key)
        return cls(path.absolute(), what)

    def __call__(self) -> str:
        """The key; ValueError when its file is missing, readable by others, or empty."""
        try:
            key = read_private(self.path).removesuffix("\n")
        except ValueError as e:
            raise ValueError(f"{self.what}: {e}") from None
        if not key:
            raise ValueError(f"{self.what}: {self.path} is empty")
        return key


def api_key_path() -> Path:
    """Where `up` keeps the API key for the router: the file the deploy YAMLs make its key in."""
    return record_path().parent / "api_key"


def tls_key_path() -> Path:
    """Where `up` keeps the TLS private key for the router and the metadata service."""
    return record_path().parent / "tls_key"


@dataclass(frozen=True, slots=True)
class NodeTls:
    """TLS files for an actor: the certificate chain (public) by value, the private key as a NodeKey.
    Calling it loads the key."""

    cert_chain: bytes
    private_key: NodeKey
    ca: bytes | None = None

    @classmethod
    def staged(cls, tls: TlsFiles) -> "NodeTls":
        """The loader of `tls`, its key written (0600) to tls_key_path() on this node first."""
        return cls(tls.cert_chain, NodeKey.staged(tls_key_path(), tls.private_key.decode(), "the TLS private key"),
                   tls.ca)

    def __call__(self) -> TlsFiles:
        return TlsFiles(self.cert_chain, self.private_key().encode(), self.ca)
