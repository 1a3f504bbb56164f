"""`radixmesh ray-tls` mints this host's certificate for Ray's mutual TLS from the cluster secret (once,
in a 0700 folder per host address, or the folder `--dir` names, the key 0600) and prints the variables
Ray reads; it re-mints only for another CA, missing addresses or a certificate near its end, and
refuses a folder others could have written. Ray itself speaking that TLS between hosts:
tests/ray/multihost/test_ray_up_cluster.py; the KubeRay pods' initContainers: tests/test_deploy_kuberay.py."""

import datetime
import ipaddress
import os
import shlex
import ssl
import stat
from pathlib import Path

from click.testing import CliRunner
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID
from cryptography.x509.verification import PolicyBuilder, Store

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
    files = ray_tls_files(secret, ["10.0.0.5"], now=now)
    assert files.folder == home / "ray-tls" / "10.0.0.5"
    first = (files.folder / "node.pem").read_bytes()
    assert (ray_tls_files(secret, ["10.0.0.5"], now=now + datetime.timedelta(days=1)).folder / "node.pem"
            ).read_bytes() == first  # kept: Ray may be reading it
    wider = ray_tls_files(secret, ["10.0.0.5", "fd00::5"], now=now)  # an address it does not name
    second = (wider.folder / "node.pem").read_bytes()
    assert second != first
    late = now + datetime.timedelta(days=LEAF_DAYS - RENEW_DAYS + 1)  # near its end
    assert (ray_tls_files(secret, ["10.0.0.5"], now=late).folder / "node.pem").read_bytes() != second
    other = ray_tls_files(ClusterSecret(bytes(32)), ["10.0.0.5"], now=late)  # another cluster's CA
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


def sans(cert: Path) -> set[str]:
    leaf = x509.load_pem_x509_certificate(cert.read_bytes())
    names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return {str(ip) for ip in names.get_values_for_type(x509.IPAddress)} | set(names.get_values_for_type(x509.DNSName))


def test_dir_writes_the_three_files_into_a_private_folder_inside_an_open_volume(home: Path, tmp_path: Path) -> None:
    """`--dir` as a KubeRay pod runs it: its volume (an emptyDir) is 0777, the folder inside it is made
    0700, and the files are where the printed variables say, nothing under $RADIXMESH_HOME."""
    secret = create_secret(home / "secret")
    volume = tmp_path / "volume"
    volume.mkdir()
    volume.chmod(0o777)
    folder = volume / "node"
    result = CliRunner().invoke(main, ["ray-tls", "--dir", str(folder), "--address", "10.0.0.5"])
    assert result.exit_code == 0, result.output
    assert exported(result.output) == {"RAY_USE_TLS": "1", "RAY_TLS_SERVER_CERT": str(folder / "node.pem"),
                                       "RAY_TLS_SERVER_KEY": str(folder / "node.key"),
                                       "RAY_TLS_CA_CERT": str(folder / "ca.pem")}
    assert sorted(os.listdir(volume)) == ["node"]  # no staging folder left beside it
    assert sorted(os.listdir(folder)) == ["ca.pem", "node.key", "node.pem"]
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700 and stat.S_IMODE((folder / "node.key").stat().st_mode) == 0o600
    assert not (home / "ray-tls").exists()
    assert (folder / "ca.pem").read_bytes() == ClusterCa.derive(secret).certificate
    assert sans(folder / "node.pem") == {"10.0.0.5"}


def test_dir_keeps_a_good_certificate_and_replaces_one_that_no_longer_fits(home: Path, tmp_path: Path) -> None:
    create_secret(home / "secret")
    folder = tmp_path / "a" / "b"  # missing, its parent too
    assert CliRunner().invoke(main, ["ray-tls", "--dir", str(folder), "--address", "10.0.0.5"]).exit_code == 0
    first = (folder / "node.pem").read_bytes()
    assert CliRunner().invoke(main, ["ray-tls", "--dir", str(folder), "--address", "10.0.0.5"]).exit_code == 0
    assert (folder / "node.pem").read_bytes() == first  # kept: Ray may be reading it
    wider = ["ray-tls", "--dir", str(folder), "--address", "10.0.0.5", "--address", "10.0.0.6"]
    assert CliRunner().invoke(main, wider).exit_code == 0
    assert (folder / "node.pem").read_bytes() != first and sans(folder / "node.pem") == {"10.0.0.5", "10.0.0.6"}
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700 and sorted(os.listdir(folder.parent)) == ["b"]


def test_dir_refuses_a_folder_others_can_write_and_leaves_it_untouched(home: Path, tmp_path: Path) -> None:
    """Refused, not fixed: ray-tls makes only 0700 folders, so someone else made this one and may have
    put their own key in it; replacing it would hide that. The same for a link to a folder."""
    create_secret(home / "secret")
    open_folder = tmp_path / "open"
    open_folder.mkdir()
    open_folder.chmod(0o777)
    (open_folder / "node.key").write_text("a key someone else knows")
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(private)
    for folder, why in ((open_folder, "group or others can write it (mode 777)"), (link, "not a directory")):
        result = CliRunner().invoke(main, ["ray-tls", "--dir", str(folder), "--address", "10.0.0.5"])
        assert result.exit_code == 1 and f"{folder}: {why}" in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1
    assert sorted(os.listdir(open_folder)) == ["node.key"] and (open_folder / "node.key").read_text() == "a key someone else knows"
    assert os.listdir(private) == []


def test_also_address_names_a_service_besides_every_address_of_this_host(home: Path) -> None:
    """The KubeRay head: workers dial its GCS by the head Service's DNS name and verify it, as they
    verify the pod's own addresses."""
    secret = create_secret(home / "secret")
    service = "radixmesh-head-svc.default.svc.cluster.local"
    result = CliRunner().invoke(main, ["ray-tls", "--also-address", service])
    assert result.exit_code == 0, result.output
    cert = Path(exported(result.output)["RAY_TLS_SERVER_CERT"])
    assert sans(cert) == set(host_addresses()) | {service}
    leaf, *chain = x509.load_pem_x509_certificates(cert.read_bytes())
    verifier = PolicyBuilder().store(Store([x509.load_pem_x509_certificate(ClusterCa.derive(secret).certificate)]))
    verifier.build_server_verifier(x509.DNSName(service)).verify(leaf, chain)  # raises when it does not
    verifier.build_server_verifier(x509.IPAddress(ipaddress.ip_address("127.0.0.1"))).verify(leaf, chain)


def test_a_kubernetes_variable_left_unexpanded_is_refused_before_anything_is_written(home: Path, tmp_path: Path) -> None:
    """A pod without FQ_RAY_IP keeps `$(FQ_RAY_IP)` as written: the initContainer fails (so the pod
    never starts) instead of minting a certificate workers could not verify."""
    create_secret(home / "secret")
    result = CliRunner().invoke(main, ["ray-tls", "--dir", str(tmp_path / "node"), "--also-address", "$(FQ_RAY_IP)"])
    assert result.exit_code == 1 and "not an IP address nor a host name: $(FQ_RAY_IP)" in result.output
    assert not (tmp_path / "node").exists()
