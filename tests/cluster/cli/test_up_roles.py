"""`radixmesh up --prefill P --decode D` (issue 37): --local N counts every agent; combinations `up`
cannot start are refused with one line and exit code 2, before Ray starts."""

from pathlib import Path

import pytest
from click.testing import CliRunner

from radixmesh.cluster.cli import up_down as cluster_cli
from radixmesh.cluster.cli.main import main
from radixmesh.cluster.launch.config import LauncherConfig


class _RayStarted(Exception):
    """Raised by the stand-in for Ray's start: every check of `up` has passed."""


@pytest.fixture
def started(home: Path, monkeypatch: pytest.MonkeyPatch) -> list[LauncherConfig]:
    configs: list[LauncherConfig] = []

    def no_ray(config: LauncherConfig, **_: object) -> None:
        configs.append(config)
        raise _RayStarted

    monkeypatch.setattr(cluster_cli.launcher, "init_local_ray", no_ray)
    return configs


def test_a_split_starts_prefill_and_decode_agents(started: list[LauncherConfig]) -> None:
    result = CliRunner().invoke(main, ["up", "--local", "3", "--prefill", "1", "--decode", "2", "--port", "0"])
    assert isinstance(result.exception, _RayStarted), result.output
    (config,) = started
    assert (config.local_nodes, config.prefill_nodes, config.decode_nodes) == (3, 1, 2)
    assert config.local_prefill_max_tokens == config.router_config("layout", 1024).local_prefill_max_tokens == 256


def test_the_local_prefill_limit_reaches_the_router(started: list[LauncherConfig]) -> None:
    result = CliRunner().invoke(main, ["up", "--local", "2", "--prefill", "1", "--decode", "1",
                                       "--local-prefill-max-tokens", "0", "--port", "0"])
    assert isinstance(result.exception, _RayStarted), result.output
    (config,) = started
    assert config.router_config("layout", 1024).local_prefill_max_tokens == 0  # every request handed off


@pytest.mark.parametrize(("args", "said"), [
    (["--local", "2", "--prefill", "1"], "--prefill and --decode go together"),
    (["--prefill", "1", "--decode", "1"], "need --local 2"),
    (["--local", "3", "--prefill", "1", "--decode", "1"], "make 2 agents, but --local says 3"),
    (["--local", "2", "--prefill", "0", "--decode", "2"], "0 is not in the range"),
    (["--local", "2", "--prefill", "1", "--decode", "1", "--local-prefill-max-tokens", "-1"], "-1 is not in the range"),
])
def test_a_split_up_cannot_start_is_refused(started: list[LauncherConfig], args: list[str], said: str) -> None:
    result = CliRunner().invoke(main, ["up", *args, "--port", "0"])
    assert result.exit_code == 2 and said in result.output, result.output
    assert not started
