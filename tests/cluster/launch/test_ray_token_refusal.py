"""`up --address` to a Ray cluster that wants a token this process lacks (issue 40): one line naming
the token and its fix, not "no Ray cluster". The exception texts are Ray 2.60's, copied from a live
refusal (a head with RAY_AUTH_MODE=token, a driver without the token)."""

import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from ray.exceptions import AuthenticationError

from radixmesh.cluster.cli import up_down as cluster_cli
from radixmesh.cluster.cli.main import main
from radixmesh.cluster.launch.ray_auth import check_token, token_refusal

# ray.init's ConnectionError after its retries; the cause carries the GCS's refusal as text.
GCS_REFUSAL = ("Failed to connect to GCS. Last connection error: Traceback (most recent call last):\n"
               '  File "python/ray/includes/common.pxi", line 119, in ray._raylet.check_status\n'
               "ray.exceptions.AuthenticationError: RPC error: InvalidAuthToken: Authentication token is "
               "missing or incorrect. Note: RAY_AUTH_MODE is currently 'disabled' (not 'token').\n")
NO_TOKEN = "Token authentication is enabled but no authentication token was found"


def refused_connection() -> ConnectionError:
    try:
        try:
            raise RuntimeError(GCS_REFUSAL)
        except RuntimeError as cause:
            raise ConnectionError("Failed to connect to Ray cluster at 10.0.0.1:6379") from cause
    except ConnectionError as e:
        return e


def test_a_refused_token_names_the_mode_and_the_fix() -> None:
    line = token_refusal(refused_connection(), auth_mode=None)
    assert line is not None and "\n" not in line
    assert "RAY_AUTH_MODE=(unset), so it sent no token" in line
    assert "set RAY_AUTH_MODE=token and copy the head's ~/.ray/auth_token" in line and "RAY_AUTH_TOKEN" in line


def test_token_mode_without_a_token_says_the_token_is_missing() -> None:
    line = token_refusal(AuthenticationError(NO_TOKEN), auth_mode="token")
    assert line is not None and "this process has no token" in line


def test_token_mode_with_a_refused_token_says_it_is_not_the_clusters() -> None:
    line = token_refusal(refused_connection(), auth_mode="token")
    assert line is not None and "token is not the cluster's" in line


def test_no_cluster_at_all_is_not_a_token_problem() -> None:
    nobody = ConnectionError("Could not find any running Ray instance. Please specify the one to connect to.")
    assert token_refusal(nobody, auth_mode=None) is None


def test_the_token_check_leaves_addresses_nobody_answers_to_ray_init() -> None:
    t0 = time.monotonic()
    for address in ("auto", "ray://10.0.0.1:10001", "127.0.0.1:1"):
        check_token(address)  # returns: ray.init reports these itself
    assert time.monotonic() - t0 < 5  # not GcsClient's 40 s wait for a GCS that is not there


def test_up_prints_the_token_problem_not_no_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RADIXMESH_HOME", str(tmp_path))
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)

    def refuse(**_: object) -> None:
        raise refused_connection()

    monkeypatch.setattr(cluster_cli.ray, "init", refuse)
    result = CliRunner().invoke(main, ["up", "--address", "127.0.0.1:1", "--host", "127.0.0.1", "--port", "0"])
    assert result.exit_code == 1, result.output
    assert "Error: the Ray cluster at '127.0.0.1:1' requires Ray token authentication" in result.output
    assert "no Ray cluster" not in result.output
