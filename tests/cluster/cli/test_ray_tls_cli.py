"""`radixmesh ray-tls` mints this host's certificate for Ray's mutual TLS from the cluster secret (once,
in a 0700 folder per host address, the key 0600) and prints the variables Ray reads; it re-mints
only for another CA, missing addresses or a certificate near its end. Ray itself speaking that TLS
between hosts: tests/ray/multihost/test_ray_up_cluster.py."""

import datetime
import shlex
import ssl
import stat
from pathlib import Path

from click.testing import CliRunner
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from radixmesh.cluster.cli.main import main
from radixmesh.cluster.launch.ray_tls import RENEW_DAYS, host_addresses, ray_tls_files
from radixmesh.cluster.launch.secret_file import create_secret
from radixmesh.common.cluster_ca import LEAF_DAYS, ClusterCa
from radixmesh.common.secret import ClusterSecret


def exported(output: str) -> dict[str, str]:
    """The `export NAME=value` lines as the shell's eval would set them."""
    pairs = [shlex.split(line.removeprefix("export "))[0].split("=", 1) for line in output.splitlines()]
    return {k: v for k, v in pairs}


def test_it_mints_a_client_and_server_certificate_of_the_cluster_ca_for_this_hosts_addresses(home: Path) -> None:
    secret = create_secret(home / "secret")
    result = CliRunner().invoke(main, ["ray-tls", "--address", "198.18.0.7", "--address", "127.0.0.1"])
    assert result.exit_code == 0, result.output
    env = exported(result.output)
    folder = home / "ray-tls" / "198.18.0.7"
    assert env == {"RAY_USE_TLS": "1", "RAY_TLS_SERVER_CERT": str(folder / "node.pem"),
                   "RAY_TLS_SERVER_KEY": str(folder / "node.key"), "RAY_TLS_CA_CERT": str(folder / "ca.pem")}
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700 and stat.S_IMODE((folder / "node.key").stat().st_mode) == 0o600
    ca = ClusterCa.derive(secret)
    assert (folder / "ca.pem").read_bytes() == ca.certificate
    # Python's TLS verifies the chain against the CA and the address, as Ray's gRPC does.
    ctx = ssl.create_default_context(cadata=ca.certificate.decode())
    ctx.load_cert_chain(folder / "node.pem", folder / "node.key")  # the key matches the certificate
    leaf = x509.load_pem_x509_certificate((folder / "node.pem").read_bytes())
    usages = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH} <= set(usages)
    sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)} == {"198.18.0.7", "127.0.0.1"}


def test_it_keeps_a_good_certificate_and_mints_again_only_when_it_must(home: Path) -> None:
    secret = ClusterSecret(bytes(range(32)))
    now = datetime.datetime(2026, 12, 1, tzinfo=datetime.UTC)
    files = ray_tls_files(secret, ["10.0.0.5"], home, now)
    first = (files.folder / "node.pem").read_bytes()
    assert (ray_tls_files(secret, ["10.0.0.5"], home, now + datetime.timedelta(days=1)).folder / "node.pem"
            ).read_bytes() == first  # kept: Ray may be reading it
    wider = ray_tls_files(secret, ["10.0.0.5", "fd00::5"], home, now)  # an address it does not name
    second = (wider.folder / "node.pem").read_bytes()
    assert second != first
    late = now + datetime.timedelta(days=LEAF_DAYS - RENEW_DAYS + 1)  # near its end
    assert (ray_tls_files(secret, ["10.0.0.5"], home, late).folder / "node.pem").read_bytes() != second
    other = ray_tls_files(ClusterSecret(bytes(32)), ["10.0.0.5"], home, late)  # another cluster's CA
    assert (other.folder / "ca.pem").read_bytes() == ClusterCa.derive(ClusterSecret(bytes(32))).certificate
    assert sorted(p.name for p in (home / "ray-tls").iterdir()) == ["10.0.0.5"]  # no staging left behind


def test_without_a_secret_it_is_one_line_and_writes_nothing(home: Path) -> None:
    result = CliRunner().invoke(main, ["ray-tls"])
    assert result.exit_code == 1 and "the cluster secret: cannot read" in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert not (home / "ray-tls").exists()


def test_this_hosts_addresses_lead_with_a_global_one_and_name_loopback() -> None:
    found = host_addresses()
    assert "127.0.0.1" in found and "localhost" in found and len(found) == len(set(found))
    assert all(not a.startswith("fe80") for a in found)
