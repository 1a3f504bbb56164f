"""`radixmesh admin-key` prints the admin key derived from the secret `up` runs with (flag,
RADIXMESH_SECRET, $RADIXMESH_HOME/secret), and never makes a secret: none, or one others can read,
is one line and exit 1."""

import os
from pathlib import Path

import pytest
import zmq
from click.testing import CliRunner

from radixmesh.cluster.api.admin import admin_key
from radixmesh.cluster.cli.main import main
from radixmesh.cluster.launch.secret_file import create_secret
from radixmesh.common.cluster_ca import ClusterCa
from radixmesh.common.kv_events_curve import key_pair
from radixmesh.common.secret import ClusterSecret, KeyPurpose

SECRET = "5" * 64


def test_it_prints_the_key_of_the_secret_up_uses(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made = create_secret(home / "secret")  # what `up` made on first use
    result = CliRunner().invoke(main, ["admin-key"])
    assert (result.exit_code, result.output) == (0, admin_key(made) + "\n")
    given = create_secret(home / "given")
    assert CliRunner().invoke(main, ["admin-key", "--secret-file", str(home / "given")]).output.strip() == \
        admin_key(given)
    monkeypatch.setenv("RADIXMESH_SECRET", SECRET)
    assert CliRunner().invoke(main, ["admin-key"]).output.strip() == admin_key(ClusterSecret.from_hex(SECRET))


def test_without_a_secret_it_says_so_and_makes_none(home: Path) -> None:
    result = CliRunner().invoke(main, ["admin-key"])
    assert result.exit_code == 1 and "the cluster secret: cannot read" in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert not (home / "secret").exists()


def test_a_secret_others_can_read_is_refused(home: Path) -> None:
    create_secret(home / "secret")
    os.chmod(home / "secret", 0o644)
    result = CliRunner().invoke(main, ["admin-key"])
    assert result.exit_code == 1 and "accessible to other users" in result.output


def test_ca_cert_prints_the_cluster_cas_certificate_and_never_makes_a_secret(home: Path) -> None:
    assert CliRunner().invoke(main, ["ca-cert"]).exit_code == 1 and not (home / "secret").exists()
    made = create_secret(home / "secret")
    result = CliRunner().invoke(main, ["ca-cert"])
    assert (result.exit_code, result.output.encode()) == (0, ClusterCa.derive(made).certificate)


def test_kv_events_keys_prints_the_curve_keys_agents_admit_and_never_makes_a_secret(home: Path) -> None:
    assert CliRunner().invoke(main, ["kv-events-keys"]).exit_code == 1 and not (home / "secret").exists()
    made = create_secret(home / "secret")
    result = CliRunner().invoke(main, ["kv-events-keys"])
    printed = dict(line.split("=", 1) for line in result.output.split())
    server, client = key_pair(made, KeyPurpose.KV_EVENTS_SERVER), key_pair(made, KeyPurpose.KV_EVENTS_CLIENT)
    assert printed == {"server_public": server.public.decode(), "client_public": client.public.decode(),
                       "client_secret": client.secret.decode()}
    assert zmq.curve_public(printed["client_secret"].encode()) == client.public  # a pair that belongs together
