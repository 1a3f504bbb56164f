"""The first minutes with `radixmesh` (issue 40): the conventions a vLLM/SGLang/Ray user types without
reading (`-h`, `--version`, `--config` and `--log-level` after the command), one variable name per flag
and a warning for a variable that names nothing, a fast `--help`, `down` that is idempotent and a dead
`up`'s record that clears itself, and a busy port found before Ray starts. No Ray: `up` is stopped
before it would start one."""

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from radixmesh.cluster.cli import up_down as cluster_cli
from radixmesh.cluster.cli.main import COMMANDS, main, package_version
from radixmesh.cluster.launch import cluster_record
from radixmesh.cluster.launch.config import LauncherConfig


class _RayStarted(Exception):
    """Raised by the stand-in for Ray's start: everything `up` checks first has passed."""


@pytest.fixture
def home(home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """conftest's home, with Ray's start stood in for."""
    def no_ray(config: LauncherConfig, **_: object) -> None:
        raise _RayStarted

    monkeypatch.setattr(cluster_cli.launcher, "init_local_ray", no_ray)
    return home


@pytest.mark.parametrize("command", [[], *([c] for c in sorted(COMMANDS))])
def test_version_and_dash_h_work_before_and_after_every_command(home: Path, command: list[str]) -> None:
    version = CliRunner().invoke(main, [*command, "--version"])
    assert version.exit_code == 0 and version.output == f"radixmesh {package_version()}\n"
    short = CliRunner().invoke(main, [*command, "-h"])
    assert short.exit_code == 0 and short.output.startswith("Usage: ")
    assert "--config FILE" in short.output and "--log-level" in short.output


def test_config_and_log_level_after_the_command(home: Path) -> None:
    both = home / "all.yaml"
    both.write_text("up:\n  local: 0\n")
    flat = home / "up.yaml"
    flat.write_text("local: 0\n")
    for path in (both, flat):  # the group's mapping of command to options, or this command's options
        result = CliRunner().invoke(main, ["up", "--config", str(path), "--log-level", "debug"])
        assert result.exit_code == 2 and "0 is not in the range" in result.output, result.output
    wrong = home / "wrong.yaml"
    wrong.write_text("gpu-blokcs: 3\n")
    result = CliRunner().invoke(main, ["up", "--config", str(wrong)])
    assert result.exit_code == 2 and "`up` has no option 'gpu-blokcs'" in result.output


def test_a_variable_is_named_after_its_flag(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RADIXMESH_UP_LOCAL", "0")  # --local, whose parameter is local_nodes
    result = CliRunner().invoke(main, ["up"])
    assert result.exit_code == 2 and "0 is not in the range" in result.output
    assert "RADIXMESH_UP_MODEL;" in CliRunner().invoke(main, ["up", "--help"]).output


def test_a_variable_that_names_no_setting_is_reported_with_the_nearest_name(
        home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RADIXMESH_UP_MODEL_SPEC", "bogus")
    monkeypatch.setenv("RADIXMESH_BENCH_RATES", "1")  # another command's: not judged by `up`
    result = CliRunner().invoke(main, ["up", "--local", "1", "--port", "0"])
    assert isinstance(result.exception, _RayStarted)
    assert ("warning: RADIXMESH_UP_MODEL_SPEC is not a radixmesh setting and is ignored; "
            "did you mean RADIXMESH_UP_MODEL?") in result.output
    assert "RADIXMESH_BENCH_RATES" not in result.output


def test_help_lists_the_commands_without_importing_them() -> None:
    code = ("import sys; from radixmesh.cluster.cli.main import main\n"
            "try: main(['--help'])\nexcept SystemExit: pass\n"
            "print(sorted(m for m in ('torch', 'ray', 'aiohttp') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[-1] == "[]"
    assert all(f"  {name} " in out for name in COMMANDS)


def test_down_with_nothing_up_says_so_and_succeeds_every_time(home: Path) -> None:
    for _ in range(2):
        result = CliRunner().invoke(main, ["down"])
        assert result.exit_code == 0 and "nothing is running" in result.output


@pytest.fixture
def ended_pid() -> int:
    with subprocess.Popen([sys.executable, "-c", "pass"]) as child:
        pass  # leaving waits for it: its pid now runs nothing
    return child.pid


def test_up_clears_the_record_of_an_up_that_died(home: Path, ended_pid: int) -> None:
    cluster_record.save(cluster_record.ClusterRecord("http://127.0.0.1:9", "127.0.0.1:9", None, ended_pid, 12345))
    result = CliRunner().invoke(main, ["up", "--local", "1", "--port", "0"])
    assert isinstance(result.exception, _RayStarted), result.output
    assert f"cleared the record of an `up` (process {ended_pid}) that has ended" in result.output


def test_down_clears_the_record_of_an_up_that_died(home: Path, ended_pid: int) -> None:
    cluster_record.save(cluster_record.ClusterRecord("http://127.0.0.1:9", "127.0.0.1:9", None, ended_pid, 12345))
    result = CliRunner().invoke(main, ["down"])
    assert result.exit_code == 0 and "the record is cleared" in result.output
    assert cluster_record.load() is None


def test_up_refuses_while_the_recorded_up_runs(home: Path) -> None:
    me = os.getpid()
    cluster_record.save(cluster_record.ClusterRecord("http://127.0.0.1:9", "127.0.0.1:9", None, me,
                                                     cluster_record.running_since(me)))
    result = CliRunner().invoke(main, ["up", "--local", "1", "--port", "0"])
    assert result.exit_code == 1 and "a deployment is running" in result.output and "`radixmesh down` first" in result.output


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_a_busy_port_is_reported_before_ray_starts(home: Path, busy_port: int) -> None:
    result = CliRunner().invoke(main, ["up", "--local", "1", "--port", str(busy_port)])
    assert result.exit_code == 1, result.output  # _RayStarted would be exit 1 with an exception
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert f"port {busy_port} on 127.0.0.1 is not free" in result.output
