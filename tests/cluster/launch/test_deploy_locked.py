"""The shipped `ray up` configs run Ray and radixmesh locked (issue 28, findings 3 and 12): every Ray
process with token authentication, the token and the cluster secret shipped to every host at mode
0600, `radixmesh up` with an API key it reads from a 0600 file made on the head, and the transfer
MAC on. `radixmesh front` takes its API key from the environment too."""

import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from radixmesh.cluster.cli import front as front_cli
from radixmesh.cluster.cli.main import main
from radixmesh.cluster.cli.route_stats import API_KEY_ENV

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
YAMLS = ["cluster.yaml", "local-cluster.yaml"]


def _config(name: str) -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load((DEPLOY / name).read_text())
    return config


def _commands(config: dict[str, Any], *keys: str) -> list[str]:
    return [c for key in keys for c in config.get(key, [])]


@pytest.mark.parametrize("name", YAMLS)
def test_every_ray_process_and_ray_command_runs_with_token_authentication(name: str) -> None:
    config = _config(name)
    starts = [c for c in _commands(config, "head_start_ray_commands", "worker_start_ray_commands") if "ray start" in c]
    assert len(starts) == 2, starts  # the head's and the workers'
    for command in starts:
        assert command.split("ray start")[0].split().count("RAY_AUTH_MODE=token") == 1, command
    [up] = [c for c in config["head_start_ray_commands"] if "radixmesh up" in c]
    # `ray status` and `radixmesh up` (a Ray driver) speak to the GCS: token mode before either.
    assert up.index("export RAY_AUTH_MODE=token") < up.index("ray status") < up.index("radixmesh up")
    # The dashboard (the Jobs API: code execution) stays on loopback.
    [head_start] = [c for c in starts if "--head" in c]
    assert "--dashboard-host=127.0.0.1" in head_start


@pytest.mark.parametrize("name", YAMLS)
def test_the_token_and_the_cluster_secret_reach_every_host_at_mode_0600(name: str, tmp_path: Path) -> None:
    config = _config(name)
    mounts = config["file_mounts"]
    # The same path on every host as on the machine that runs `ray up`: Ray's default token file,
    # radixmesh's default secret file (what `up` and every agent read without a flag).
    assert mounts["~/.ray/auth_token"] == "~/.ray/auth_token"
    assert mounts["~/.radixmesh/secret"] == "~/.radixmesh/secret"
    # rsync keeps the local modes; the setup closes them, whatever they were.
    for path in (tmp_path / ".ray" / "auth_token", tmp_path / ".radixmesh" / "secret"):
        path.parent.mkdir()
        path.write_text("x\n")
        path.chmod(0o644)
    [chmod] = [c for c in config["setup_commands"] if "chmod" in c]
    subprocess.run(["bash", "-c", chmod], check=True, env={**os.environ, "HOME": str(tmp_path)})
    for path in (tmp_path / ".ray" / "auth_token", tmp_path / ".radixmesh" / "secret"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


@pytest.mark.parametrize("name", YAMLS)
def test_up_runs_with_an_api_key_made_once_on_the_head_and_the_transfer_mac(name: str, tmp_path: Path) -> None:
    config = _config(name)
    [make_key] = config["head_setup_commands"]
    env = {**os.environ, "HOME": str(tmp_path)}
    (tmp_path / ".radixmesh").mkdir()  # the secret's file mount made it
    subprocess.run(["bash", "-c", make_key], check=True, env=env)
    key_file = tmp_path / ".radixmesh" / "api_key"
    key = key_file.read_text().strip()
    assert len(key) >= 32 and stat.S_IMODE(key_file.stat().st_mode) == 0o600
    subprocess.run(["bash", "-c", make_key], check=True, env=env)
    assert key_file.read_text().strip() == key  # a later `ray up` keeps the key clients hold
    [up] = [c for c in config["head_start_ray_commands"] if "radixmesh up" in c]
    # The key reaches `up` through its environment (RADIXMESH_API_KEY), never its command line.
    assert f'{API_KEY_ENV}="$(cat ~/.radixmesh/api_key)"' in up and "--api-key" not in up
    assert "--transfer-mac" in up  # the YAML spans hosts: pulled KV chunks are keyed


def test_front_takes_its_api_key_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []

    async def serve(*args: object, **kwargs: object) -> None:
        seen.append(str(args[-2]))  # the api key (the admin config follows it)

    monkeypatch.setattr(front_cli, "_serve", serve)
    monkeypatch.setenv(API_KEY_ENV, "key-from-env")
    result = CliRunner().invoke(main, ["front", "--model", "m", "--engine",
                                       "name=e0,url=http://127.0.0.1:1,events=tcp://127.0.0.1:2"])
    assert result.exit_code == 0, result.output
    assert seen == ["key-from-env"]


@pytest.mark.parametrize("name", YAMLS)
def test_every_ray_start_runs_with_rays_tls_and_none_without_it(name: str, tmp_path: Path) -> None:
    """Each `ray start` command, run by bash as Ray's command runner does, with stand-ins for
    `radixmesh` and `ray` on PATH: Ray starts with the variables `radixmesh ray-tls` printed, and
    not at all when it fails (no secret, say): never quietly without TLS."""
    config = _config(name)
    starts = [c for c in _commands(config, "head_start_ray_commands", "worker_start_ray_commands") if "ray start" in c]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    seen = tmp_path / "ray-saw"
    (bin_dir / "ray").write_text(f'#!/bin/sh\necho "$RAY_USE_TLS $RAY_TLS_SERVER_CERT" > {seen}\n')
    for ok in (True, False):
        body = 'echo "export RAY_USE_TLS=1 RAY_TLS_SERVER_CERT=/certs/node.pem"' if ok else "echo 'no secret' >&2; exit 1"
        (bin_dir / "radixmesh").write_text(f"#!/bin/sh\n{body}\n")
        for tool in ("ray", "radixmesh"):
            (bin_dir / tool).chmod(0o755)
        for command in starts:
            seen.unlink(missing_ok=True)
            env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "RAY_HEAD_IP": "10.0.0.10", "HOME": str(tmp_path)}
            done = subprocess.run(["bash", "-c", command], check=False, env=env, capture_output=True, text=True, timeout=30)
            if ok:
                assert done.returncode == 0, done.stderr
                assert seen.read_text().split() == ["1", "/certs/node.pem"], command
            else:
                assert done.returncode != 0 and not seen.exists(), command
    [up] = [c for c in config["head_start_ray_commands"] if "radixmesh up" in c]
    # The driver and `ray status` speak to the GCS: Ray's TLS variables before either.
    assert up.index('eval "$(radixmesh ray-tls || echo exit 1)"') < up.index("ray status") < up.index("radixmesh up")
