"""The cluster CA: derived from the secret alike on every node, or an operator's from --tls-dir."""

import datetime
import ipaddress
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError

from radixmesh.common.cluster_ca import CA_FILE, CA_KEY_FILE, ClusterCa, ServerCertificate, served_names
from radixmesh.common.secret import ClusterSecret

SECRET = ClusterSecret(bytes(range(32)))
HEAD = "198.18.0.1"


def verify(served: ServerCertificate, trusted: bytes, address: str = HEAD) -> None:
    """What a TLS client does with the chain: VerificationError unless it reaches `trusted` for `address`."""
    leaf, *chain = x509.load_pem_x509_certificates(served.cert_chain)
    store = Store(x509.load_pem_x509_certificates(trusted))
    verifier = PolicyBuilder().store(store).build_server_verifier(x509.IPAddress(ipaddress.ip_address(address)))
    verifier.verify(leaf, chain)


def test_two_derivations_from_one_secret_verify_each_others_leaves() -> None:
    head, worker = ClusterCa.derive(SECRET), ClusterCa.derive(SECRET)
    assert head.certificate == worker.certificate  # byte for byte: nothing to distribute
    verify(head.issue([HEAD]), worker.certificate)
    verify(worker.issue(["198.18.0.2"]), head.certificate, "198.18.0.2")


def test_a_leaf_of_another_secret_is_refused() -> None:
    other = ClusterCa.derive(ClusterSecret(bytes(range(1, 33))))
    with pytest.raises(VerificationError):
        verify(other.issue([HEAD]), ClusterCa.derive(SECRET).certificate)


def test_a_leaf_is_only_good_for_its_own_addresses() -> None:
    ca = ClusterCa.derive(SECRET)
    with pytest.raises(VerificationError):
        verify(ca.issue([HEAD]), ca.certificate, "198.18.0.2")


def test_every_leaf_has_a_fresh_key_never_the_cas() -> None:
    ca = ClusterCa.derive(SECRET)
    a, b = ca.issue([HEAD]), ca.issue([HEAD])
    assert a.private_key != b.private_key
    assert "key=" not in repr(ca)  # the CA's key never reaches a log


def test_a_wildcard_bind_is_named_by_the_node_address() -> None:
    assert served_names("0.0.0.0", HEAD) == [HEAD]
    assert served_names(HEAD, HEAD) == [HEAD]
    assert served_names("head.example", HEAD) == ["head.example", HEAD]


def operator_ca(folder: Path, key_mode: int = 0o600) -> bytes:
    """An operator's own CA written as --tls-dir holds it; its certificate."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "operator CA")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    pem = cert.public_bytes(serialization.Encoding.PEM)
    (folder / CA_FILE).write_bytes(pem)
    (folder / CA_KEY_FILE).write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                         serialization.NoEncryption()))
    (folder / CA_KEY_FILE).chmod(key_mode)
    return pem


def test_a_tls_dir_ca_mints_the_leaves_and_the_secrets_ca_does_not_trust_them(tmp_path: Path) -> None:
    pem = operator_ca(tmp_path)
    ca = ClusterCa.load(tmp_path)
    assert ca.certificate == pem
    served = ca.issue([HEAD])
    assert served.ca == pem
    verify(served, pem)
    with pytest.raises(VerificationError):
        verify(served, ClusterCa.derive(SECRET).certificate)


def test_a_tls_dir_key_others_can_read_is_refused(tmp_path: Path) -> None:
    operator_ca(tmp_path, key_mode=0o644)
    with pytest.raises(ValueError, match="accessible to other users"):
        ClusterCa.load(tmp_path)


def test_a_tls_dir_whose_key_is_not_its_certificates_is_refused(tmp_path: Path) -> None:
    operator_ca(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    operator_ca(other)
    (tmp_path / CA_KEY_FILE).write_bytes((other / CA_KEY_FILE).read_bytes())
    with pytest.raises(ValueError, match="is not the EC key of"):
        ClusterCa.load(tmp_path)


def test_a_tls_dir_without_its_files_says_which(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=CA_FILE):
        ClusterCa.load(tmp_path)
