"""Ray's own TLS between hosts (docs/security.md#ray-between-hosts): every Ray process of a multi-host
deployment speaks mutual TLS with a certificate of the cluster CA for its host's addresses.

Ray reads four variables in every process (`environment`) and presents one certificate both as server
and as client, so each host needs its own, naming every address a peer may dial (the address its
node registers, and 127.0.0.1 for its local calls). Each host mints its own from the secret it
already holds (common.cluster_ca), so nothing is distributed; the files live under
$RADIXMESH_HOME/ray-tls/<the host's first address>/, one folder per host, since one home may be
shared by every host (NFS), or in a folder given (`--dir`: a KubeRay pod's volume).

A certificate is kept while it names the host's addresses and has RENEW_DAYS left: Ray's Python side
reads the files again for every channel it opens, so a new certificate written while Ray runs could
be read beside the old key. The YAMLs run this right after `ray stop`, where a renewal is safe.
"""

import datetime
import ipaddress
import os
import re
import shutil
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil
from cryptography import x509

from radixmesh.cluster.launch.cluster_record import record_path
from radixmesh.common.cluster_ca import ClusterCa
from radixmesh.common.private_files import check_private_folder, write_new
from radixmesh.common.secret import ClusterSecret

RENEW_DAYS = 30
"""A certificate with fewer days left is minted again (a minted one lasts cluster_ca.LEAF_DAYS)."""
CERT, KEY, CA = "node.pem", "node.key", "ca.pem"


@dataclass(frozen=True, slots=True)
class RayTlsFiles:
    """One host's folder: its certificate chain, its private key (0600) and the CA, for Ray."""

    folder: Path

    def environment(self) -> dict[str, str]:
        """What every Ray process of the host (and every driver, `ray status` included) runs with."""
        return {"RAY_USE_TLS": "1", "RAY_TLS_SERVER_CERT": str(self.folder / CERT),
                "RAY_TLS_SERVER_KEY": str(self.folder / KEY), "RAY_TLS_CA_CERT": str(self.folder / CA)}


def host_addresses() -> list[str]:
    """This host's addresses a peer may dial, its first global address first (the folder's name):
    every interface's IPv4 and IPv6 addresses but link-local ones, then loopback and the host name."""
    found: list[str] = []
    for addresses in psutil.net_if_addrs().values():
        for a in addresses:
            if a.family not in (socket.AF_INET, socket.AF_INET6):
                continue
            ip = ipaddress.ip_address(a.address.split("%", 1)[0])
            if not ip.is_link_local:
                found.append(str(ip))
    found.sort(key=lambda a: ipaddress.ip_address(a).is_loopback)  # stable: interface order otherwise
    return list(dict.fromkeys([*found, "127.0.0.1", "localhost", socket.gethostname()]))


def ray_tls_files(secret: ClusterSecret, addresses: Sequence[str], folder: Path | None = None,
                  now: datetime.datetime | None = None) -> RayTlsFiles:
    """This host's files in `folder` (default: $RADIXMESH_HOME/ray-tls/<first address>/), minted from
    `secret` for `addresses` unless a certificate of the same CA naming them all, with RENEW_DAYS left,
    is there. ValueError without an address, or for one that is neither an IP nor a host name;
    PermissionError for a folder that is a link, another user's, or one others can write."""
    if not addresses:
        raise ValueError("Ray's certificate needs at least one address of this host")
    if bad := [a for a in addresses if not _is_name(a)]:
        raise ValueError(f"not an IP address nor a host name: {', '.join(bad)}")
    if folder is None:
        folder = record_path().parent / "ray-tls" / addresses[0].strip("[]").replace(":", "_")
    folder = folder.absolute()  # Ray's processes read the paths from any working directory
    # Refused, not repaired: `_mint` makes only 0700 folders, so someone else made this one and may
    # have put a key they know in it.
    check_private_folder(folder)
    ca = ClusterCa.derive(secret)
    now = now or datetime.datetime.now(datetime.UTC)
    if not _still_good(folder, ca, addresses, now):
        _mint(folder, ca, addresses, now)
    return RayTlsFiles(folder)


_HOST_NAME = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?")
"""Letters, digits, dots, hyphens (and underscores, which some hosts' names carry): what a peer can
dial. A Kubernetes `$(VAR)` left unexpanded, or a shell word, is none of these."""


def _is_name(address: str) -> bool:
    try:
        ipaddress.ip_address(address.strip("[]"))
        return True
    except ValueError:
        return _HOST_NAME.fullmatch(address) is not None


def _still_good(folder: Path, ca: ClusterCa, addresses: Sequence[str], now: datetime.datetime) -> bool:
    try:
        chain, key = (folder / CERT).read_bytes(), folder / KEY
        if (folder / CA).read_bytes() != ca.certificate or key.stat().st_mode & 0o077:
            return False
    except OSError:
        return False
    leaf = x509.load_pem_x509_certificate(chain)
    if leaf.issuer != x509.load_pem_x509_certificate(ca.certificate).subject:
        return False
    if leaf.not_valid_after_utc - now < datetime.timedelta(days=RENEW_DAYS):
        return False
    sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    named = {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)} | set(sans.get_values_for_type(x509.DNSName))
    return all(a.strip("[]") in named for a in addresses)


def _mint(folder: Path, ca: ClusterCa, addresses: Sequence[str], now: datetime.datetime) -> None:
    """Write the three files into a fresh 0700 staging folder beside `folder`, then move it into place
    (the key is never in a folder others can list, nor beside another certificate)."""
    issued = ca.issue(addresses, now, client=True)
    folder.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    staging = folder.with_name(f".{folder.name}.{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(mode=0o700)
    for name, data, mode in ((CERT, issued.cert_chain, 0o644), (KEY, issued.private_key, 0o600), (CA, issued.ca, 0o644)):
        write_new(staging / name, data, mode)
    if folder.exists():
        old = folder.with_name(f".{folder.name}.old.{os.getpid()}")
        folder.rename(old)
        shutil.rmtree(old)
    staging.rename(folder)
