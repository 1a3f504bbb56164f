"""The cluster secret (where it comes from, how it is stored, what derives from it), the refusal to
serve a non-loopback address without one, the CLI's one-line errors for hostile or broken setups (a
shared secret file, a busy port, dead URLs, a dead Redis, a recorded pid reused), and `up` with TLS."""

import os
import re
import socket
import ssl
import stat
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner

from radixmesh.cluster.cli.main import main
from radixmesh.cluster.launch import cluster_record
from radixmesh.cluster.launch.secret_file import SECRET_ENV, create_secret, deployment_secret, read_secret
from radixmesh.cluster.metadata.server import ServerOptions, create_server
from radixmesh.cluster.metadata.service import MetadataService
from radixmesh.common.secret import ClusterSecret, KeyPurpose, check_bind, is_loopback
from radixmesh.proto.ids import NodeId
from tests.cluster.launch.test_down_identity import start_decoy_up
from tests.support.servers import free_port

pytestmark = pytest.mark.ray

TRACE = Path(__file__).resolve().parents[1] / "data" / "traces" / "mooncake_trace_1000.jsonl"
EXE = Path(sys.executable).with_name("radixmesh")


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RADIXMESH_HOME", str(tmp_path))
    monkeypatch.delenv(SECRET_ENV, raising=False)
    return tmp_path


def test_derived_keys_are_distinct_and_the_secret_never_printed() -> None:
    s = ClusterSecret.generate()
    keys = [s.key(KeyPurpose.METADATA_CLUSTER), s.hash_key(), s.key(KeyPurpose.TRANSFER_HANDSHAKE, NodeId("a")),
            s.key(KeyPurpose.TRANSFER_HANDSHAKE, NodeId("b"))]
    assert len(set(keys)) == 4 and s.value not in b"".join(keys)
    assert s.to_hex() not in repr(s) and "hidden" in repr(s)
    assert ClusterSecret.from_hex(s.to_hex() + "\n") == s
    with pytest.raises(ValueError, match="at least 32 bytes"):
        ClusterSecret(b"short")
    with pytest.raises(ValueError, match="hex digits"):
        ClusterSecret.from_hex("not hex")


def test_up_makes_one_secret_0600_and_reuses_it(home: Path) -> None:
    first = deployment_secret(None)
    path = home / "secret"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert deployment_secret(None) == first  # the next `up` joins the same cluster


def test_a_given_secret_wins_and_a_shared_file_is_refused(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    given = create_secret(home / "given")
    assert deployment_secret(home / "given") == given
    monkeypatch.setenv(SECRET_ENV, ClusterSecret.generate().to_hex())
    assert deployment_secret(None) != given and not (home / "secret").exists()
    (home / "given").chmod(0o644)
    with pytest.raises(ValueError, match="accessible to other users"):
        read_secret(home / "given")
    with pytest.raises(FileExistsError):
        create_secret(home / "given")  # never overwritten


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "::", ""])
def test_no_non_loopback_bind_without_a_secret(host: str) -> None:
    assert not is_loopback(host)
    with pytest.raises(ValueError, match="refuses to bind"):
        check_bind("x", host, None)
    with pytest.raises(ValueError, match="refuses to bind"):
        create_server(MetadataService(), ServerOptions(host=host, port=0))
    check_bind("x", host, ClusterSecret.generate())
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(EXE), "--log-level", "ERROR", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, check=False)


def one_line_error(proc: subprocess.CompletedProcess[str], fragment: str) -> None:
    """One error line on stderr; `up`'s progress lines ("[HH:MM:SS] phase") may come before it."""
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.strip() and not re.match(r"\[\d\d:\d\d:\d\d\] ", line)]
    assert len(lines) == 1 and fragment in lines[0], proc.stderr


def test_metadata_server_refuses_a_public_bind_without_a_secret_and_a_busy_port(home: Path) -> None:
    one_line_error(run_cli("metadata-server", "--host", "0.0.0.0", "--port", "0"), "refuses to bind")
    shared = home / "shared"
    shared.write_text(ClusterSecret.generate().to_hex())
    shared.chmod(0o644)
    one_line_error(run_cli("metadata-server", "--secret-file", str(shared)), "accessible to other users")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        one_line_error(run_cli("metadata-server", "--port", str(port)), f"could not bind 127.0.0.1:{port}")


def test_route_and_replay_against_a_dead_url_are_one_line(home: Path) -> None:
    one_line_error(run_cli("route", "hello", "--url", "http://127.0.0.1:9"), "does not answer")
    one_line_error(run_cli("replay", str(TRACE), "--url", "http://127.0.0.1:9", "--limit", "2"), "does not answer")


def test_down_never_signals_a_process_that_is_not_radixmesh(home: Path) -> None:
    # A record whose pid now belongs to another program (the `up` ended, the pid was reused), one that
    # even looks like `radixmesh up` from a checkout in a folder named radixmesh; a record without the
    # start time is not enough to signal it.
    with start_decoy_up(home) as other:
        try:
            cluster_record.save(cluster_record.ClusterRecord("http://127.0.0.1:9", "127.0.0.1:9", None, other.pid))
            result = CliRunner().invoke(main, ["down"])
            # `down` is idempotent: a record it cannot tie to a running `up` is cleared, nothing signalled.
            assert result.exit_code == 0 and "nothing signalled" in result.output, result.output
            assert other.poll() is None  # not signalled
            assert cluster_record.load() is None
        finally:
            other.kill()


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(240)
def test_up_on_a_dead_redis_is_one_line(home: Path) -> None:
    dead = free_port()  # a port nothing listens on
    proc = run_cli("up", "--local", "1", "--port", "0", "--state", f"redis://127.0.0.1:{dead}/0", timeout=200)
    one_line_error(proc, "radixmesh up failed")
    assert not (home / "cluster.json").exists()
    assert (home / "secret").exists()  # made before anything started, kept for the next `up`


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(240)
def test_up_with_tls_serves_https_and_metadata_over_tls(home: Path) -> None:
    key, cert = home / "key.pem", home / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    env = {**os.environ, "RADIXMESH_HOME": str(home), "SSL_CERT_FILE": str(cert)}
    up = subprocess.Popen([str(EXE), "--log-level", "WARNING", "up", "--local", "1", "--port", "0",
                           "--tls-cert", str(cert), "--tls-key", str(key)],
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert up.stdout is not None
        url = next((line.split()[1] for line in up.stdout if line.startswith("router: ")), None)
        assert url is not None and url.startswith("https://127.0.0.1:"), f"`up` exited with {up.poll()}"
        trusting = ssl.create_default_context(cafile=str(cert))
        with urllib.request.urlopen(f"{url}/healthz", context=trusting, timeout=30) as r:
            assert r.status == 200
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
            urllib.request.urlopen(f"{url}/healthz", context=ssl.create_default_context(), timeout=30)
        # `route` (the router's Match to the metadata service, over TLS) and `stats` trust the
        # certificate through SSL_CERT_FILE.
        routed = subprocess.run([str(EXE), "route", "hello there, general kenobi", "--max-tokens", "2"],
                                env=env, capture_output=True, text=True, timeout=120, check=False)
        assert routed.returncode == 0, routed.stderr
        stats = subprocess.run([str(EXE), "stats", "--json"], env=env, capture_output=True, text=True, timeout=60,
                               check=False)
        assert '"live_nodes": 1' in stats.stdout, stats.stdout + stats.stderr  # agents reached it over TLS
        down = subprocess.run([str(EXE), "down"], env=env, capture_output=True, text=True, timeout=120, check=False)
        assert down.returncode == 0, down.stderr
        assert up.wait(timeout=60) == 0
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
