"""The deployment's TLS: on whenever the metadata service and the API bind beyond loopback.

`up` mints the head's server certificate from the cluster CA (an operator's from `--tls-dir`, else
the one every holder of the secret derives: common.cluster_ca) for the address they bind, and
writes the CA certificate to $RADIXMESH_HOME/tls/ca.pem, which `radixmesh stats` and `route` trust.
Loopback-only deployments stay plain text: only this host reaches them.
"""

from dataclasses import replace
from pathlib import Path

from radixmesh.cluster.launch.cluster_record import ca_file_path
from radixmesh.cluster.launch.config import LauncherConfig
from radixmesh.cluster.metadata.server import TlsFiles
from radixmesh.common.cluster_ca import ClusterCa, served_names
from radixmesh.common.private_files import replace_atomically
from radixmesh.common.secret import ClusterSecret, is_loopback


def with_tls(config: LauncherConfig, here: str) -> LauncherConfig:
    """`config` with the TLS its servers use: as given (`--tls-cert`), none on a loopback host or with
    `tls_default` off (`--no-tls`), else a certificate minted for `config.host` (and `here`, this
    node's address, when the host is a wildcard). ValueError when `tls_dir` cannot be used."""
    if config.tls is None and config.tls_default and not is_loopback(config.host):
        ca = ClusterCa.load(config.tls_dir) if config.tls_dir is not None else ClusterCa.derive(config.secret)
        served = ca.issue(served_names(config.host, here))
        config = replace(config, tls=TlsFiles(served.cert_chain, served.private_key, served.ca))
    if config.tls is not None:
        write_ca_file(config.tls.trust, ca_file_path())
    return config


def scrape_ca(tls: TlsFiles | None, secret: ClusterSecret) -> bytes:
    """What Prometheus verifies https targets against (its `ca.pem`): the secret's CA, which agents
    mint their own /metrics certificates from, then the servers' roots when they are others
    (`--tls-dir`'s CA, a `--tls-cert`): the operator's CA key stays on the head, so agents never mint
    from it."""
    derived = ClusterCa.derive(secret).certificate
    return derived if tls is None or tls.trust == derived else derived + tls.trust


def write_ca_file(pem: bytes, path: Path) -> None:
    """Write the CA certificate (public) to `path` for clients, replacing what was there; its folder
    is made 0700 when missing."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    replace_atomically(path, pem, 0o644)
