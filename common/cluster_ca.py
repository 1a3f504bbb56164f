"""The cluster's certificate authority: derived from the cluster secret, or an operator's from a folder.

Every holder of the secret derives the same CA key (a P-256 scalar from HKDF over the secret's
TLS_CA key) and builds the same CA certificate (fixed subject, validity and serial, RFC 6979
signature), so each node mints its own server certificate for its own addresses, and every node
verifies every other's, with no distribution step. The CA certificate is public; its key is as
secret as the cluster secret it comes from (docs/security.md#tls).
"""

import datetime
import ipaddress
import ssl
import stat
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.kdf.hkdf import HKDFExpand
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from radixmesh.common.secret import ClusterSecret, KeyPurpose

CA_NAME = "radixmesh cluster CA"
"""Common name of a derived CA (an operator's keeps its own)."""
CA_FILE, CA_KEY_FILE = "ca.pem", "ca.key"
"""What a `--tls-dir` holds: the CA certificate (PEM) and its private key (PEM, mode 0600)."""
LEAF_DAYS = 397
"""Validity of a minted server certificate (the CA/Browser ceiling); `up` mints a new one each start."""
# The derived CA's certificate must be the same bytes on every node: nothing in it may depend on when
# or where it is built. A secret is rotated by replacing it, so the CA lives as long as the secret.
_CA_NOT_BEFORE = datetime.datetime(2025, 1, 1, tzinfo=datetime.UTC)
_CA_NOT_AFTER = datetime.datetime(9999, 12, 31, 23, 59, 59, tzinfo=datetime.UTC)
_P256_ORDER = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551


class ServerCertificate(NamedTuple):
    """What a TLS server needs, and what its clients trust."""

    cert_chain: bytes
    """PEM: the leaf, then the CA."""
    private_key: bytes
    """PEM (PKCS#8) of the leaf's key: fresh for every certificate, never derived."""
    ca: bytes
    """PEM of the CA certificate clients verify the server against."""


@dataclass(frozen=True, slots=True)
class ClusterCa:
    """A CA certificate and its key; mints server certificates. Its repr never shows the key."""

    certificate: bytes
    """PEM, public: what clients trust (written to $RADIXMESH_HOME/tls/ca.pem by `up`)."""
    key: ec.EllipticCurvePrivateKey = field(repr=False)

    @classmethod
    def derive(cls, secret: ClusterSecret) -> "ClusterCa":
        """The CA of `secret`: every holder of the secret derives the same key and certificate."""
        # 48 bytes reduced mod n-1, then +1: a scalar in [1, n-1] with bias below 2^-128 (FIPS 186-5 A.2.1).
        okm = HKDFExpand(hashes.SHA256(), 48, b"radixmesh p256 scalar").derive(secret.key(KeyPurpose.TLS_CA))
        key = ec.derive_private_key(int.from_bytes(okm) % (_P256_ORDER - 1) + 1, ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, CA_NAME)])
        public = key.public_key()
        ski = x509.SubjectKeyIdentifier.from_public_key(public)
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(public)
                .serial_number(int.from_bytes(ski.digest[:16]) >> 1 or 1)  # positive, from the key: same everywhere
                .not_valid_before(_CA_NOT_BEFORE).not_valid_after(_CA_NOT_AFTER)
                .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                .add_extension(_CA_KEY_USAGE, critical=True)
                .add_extension(ski, critical=False)
                .sign(key, hashes.SHA256(), ecdsa_deterministic=True))
        return cls(cert.public_bytes(serialization.Encoding.PEM), key)

    @classmethod
    def load(cls, folder: Path) -> "ClusterCa":
        """An operator's CA from `folder` (CA_FILE and CA_KEY_FILE). ValueError naming the file when one
        is missing or unreadable, the key is readable by others or not an EC key, or the two do not match."""
        cert_path, key_path = folder / CA_FILE, folder / CA_KEY_FILE
        try:
            pem = cert_path.read_bytes()
            mode = key_path.stat().st_mode
            key_pem = key_path.read_bytes()
        except OSError as e:
            raise ValueError(f"--tls-dir: cannot read {e.filename}: {e.strerror} (it holds {CA_FILE} and "
                             f"{CA_KEY_FILE})") from None
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ValueError(f"--tls-dir: {key_path} is accessible to other users (mode {stat.S_IMODE(mode):o}); "
                             f"`chmod 600 {key_path}`")
        try:
            cert = x509.load_pem_x509_certificate(pem)
            key = serialization.load_pem_private_key(key_pem, password=None)
        except ValueError as e:
            raise ValueError(f"--tls-dir {folder}: not a PEM certificate and key: {e}") from None
        if not isinstance(key, ec.EllipticCurvePrivateKey) or key.public_key() != cert.public_key():
            raise ValueError(f"--tls-dir: {key_path} is not the EC key of {cert_path}")
        return cls(pem, key)

    def issue(self, hosts: Sequence[str], now: datetime.datetime | None = None, *,
              client: bool = False) -> ServerCertificate:
        """A server certificate for `hosts` (IP literals become IP SANs, other names DNS SANs), valid
        from an hour before `now` (clock skew between nodes) for LEAF_DAYS; `client`: also for TLS
        clients (mutual TLS, as Ray's processes present one certificate both ways). ValueError
        without a host."""
        names = list(dict.fromkeys(h.strip("[]") for h in hosts if h))
        if not names:
            raise ValueError("a server certificate needs at least one host name or address")
        now = now or datetime.datetime.now(datetime.UTC)
        ca = x509.load_pem_x509_certificate(self.certificate)
        leaf_key = ec.generate_private_key(ec.SECP256R1())
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
                .issuer_name(ca.subject).public_key(leaf_key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(hours=1))
                .not_valid_after(now + datetime.timedelta(days=LEAF_DAYS))
                .add_extension(x509.SubjectAlternativeName([_san(n) for n in names]), critical=False)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(_LEAF_KEY_USAGE, critical=True)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                      *([ExtendedKeyUsageOID.CLIENT_AUTH] if client else [])]),
                               critical=False)
                # Key identifier only (no issuer serial): any build of the same CA is this leaf's issuer.
                .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                               critical=False)
                .sign(self.key, hashes.SHA256()))
        return ServerCertificate(
            cert.public_bytes(serialization.Encoding.PEM) + self.certificate,
            leaf_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                   serialization.NoEncryption()),
            self.certificate)


def served_names(host: str, here: str) -> Sequence[str]:
    """The names a client may reach a server bound at `host` by: the host, or for 0.0.0.0 / :: (every
    address) this node's address, which is what the launcher advertises."""
    try:
        wildcard = ipaddress.ip_address(host.strip("[]")).is_unspecified
    except ValueError:
        wildcard = False
    return [here] if wildcard else [host, here] if host != here else [host]


def server_tls(cert_chain: Path, private_key: Path) -> ssl.SSLContext:
    """A TLS server context from PEM files (TLS 1.2 or later); OSError/ssl.SSLError when unreadable."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_chain, private_key)
    return context


def server_tls_pem(cert_chain: bytes, private_key: bytes) -> ssl.SSLContext:
    """`server_tls` from PEM bytes (ssl loads keys only from files: they live in a private temporary
    directory for the duration of the load)."""
    with tempfile.TemporaryDirectory() as d:
        cert, key = Path(d) / "cert.pem", Path(d) / "key.pem"
        cert.write_bytes(cert_chain)
        key.write_bytes(private_key)
        return server_tls(cert, key)


def _san(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


_CA_KEY_USAGE = x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                              data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                              encipher_only=False, decipher_only=False)
_LEAF_KEY_USAGE = x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                data_encipherment=False, key_agreement=False, key_cert_sign=False, crl_sign=False,
                                encipher_only=False, decipher_only=False)
