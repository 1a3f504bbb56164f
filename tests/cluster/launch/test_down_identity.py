"""`radixmesh down` knows the `up` it stops by (pid, start time), never by its command line (issue 28,
finding 13): a process that took a recorded pid is never signalled, however much it looks like
`radixmesh up`, and the recorded `up` itself is."""

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from radixmesh.cluster.cli.main import main
from radixmesh.cluster.launch import cluster_record
from radixmesh.cluster.launch.cluster_record import running_since


def start_decoy_up(folder: Path) -> subprocess.Popen[bytes]:
    """A process whose command line is `radixmesh up`'s, from a checkout in a folder named radixmesh
    (where `git clone` puts the project): `<venv>/bin/python <venv>/bin/radixmesh up --local 1`.
    It waits on its stdin, so only a signal ends it before the test does."""
    script = folder / "radixmesh" / ".venv" / "bin" / "radixmesh"
    script.parent.mkdir(parents=True)
    script.write_text(f"#!{sys.executable}\nimport sys\nprint('ready', flush=True)\nsys.stdin.read()\n")
    script.chmod(0o755)
    proc = subprocess.Popen([str(script), "up", "--local", "1"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    # Popen returns while exec may still be setting up the new command line (/proc/PID/cmdline reads
    # empty): its first line says it runs as `radixmesh up`.
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    return proc


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RADIXMESH_HOME", str(tmp_path / "home"))
    return tmp_path


@pytest.fixture
def decoy(home: Path) -> Iterator[subprocess.Popen[bytes]]:
    with start_decoy_up(home) as proc:  # leaving closes its pipes and reaps it
        yield proc
        proc.kill()


def record(pid: int, start: int | None) -> None:
    cluster_record.save(cluster_record.ClusterRecord("http://127.0.0.1:9", "127.0.0.1:9", None, pid, start))


def test_down_does_not_signal_a_pid_whose_start_time_differs(decoy: subprocess.Popen[bytes]) -> None:
    start = running_since(decoy.pid)
    assert start is not None
    record(decoy.pid, start - 1)  # the `up` that made the record started earlier under this pid
    result = CliRunner().invoke(main, ["down"])
    # The recorded `up` has ended: nothing to stop, which `down` (idempotent) says and exits 0 on.
    assert result.exit_code == 0 and "has ended (nothing signalled)" in result.output
    assert decoy.poll() is None  # not signalled
    assert cluster_record.load() is None


def test_down_signals_the_recorded_pid_and_start_time(decoy: subprocess.Popen[bytes]) -> None:
    record(decoy.pid, running_since(decoy.pid))
    result = CliRunner().invoke(main, ["down", "--timeout", "30"])
    assert result.exit_code == 0, result.output
    assert "radixmesh is down" in result.output
    assert decoy.wait(timeout=30) == -15  # SIGTERM


def test_running_since_ends_when_the_process_exits() -> None:
    with subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE) as child:
        mine, started = running_since(os.getpid()), running_since(child.pid)
        assert mine is not None and started is not None and started >= mine
        child.kill()
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, not yet reaped: a zombie
        assert running_since(child.pid) is None
    assert running_since(child.pid) is None  # reaped
