"""The `radixmesh` commands: bad input ends as one line and a non-zero exit; `stats`, `replay` and the
demo workload against a real in-process router; `up --local` / `route` / `stats` / `down` end to end
as a user runs them (separate processes, local Ray on 127.0.0.1)."""

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from radixmesh.cluster.api.app import start_http
from radixmesh.cluster.cli.demo import comparison_table
from radixmesh.cluster.cli.main import main
from radixmesh.cluster.sim.demo_workload import DemoWorkload, run_workload
from tests.support.poll import wait_for
from tests.support.router_cluster import BS, MODEL_NAME, local_cluster

pytestmark = pytest.mark.ray

TRACE = Path(__file__).resolve().parents[1] / "data" / "traces" / "mooncake_trace_1000.jsonl"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RADIXMESH_HOME", str(tmp_path))
    return tmp_path


@pytest.fixture
async def router_url() -> AsyncIterator[str]:
    async with local_cluster(2, publish=True) as c:
        runner, port = await start_http(c.router, "127.0.0.1", 0)
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            await runner.cleanup()


@pytest.mark.parametrize("args, message", [
    (["up", "--local", "2", "--state", "mysql://x"], "state must be 'memory' or a redis:// URL"),
    (["up", "--local", "0"], "0 is not in the range"),
    (["--log-level", "loud", "up", "--local", "1"], "'loud' is not one of 'debug', 'info'"),
    (["route", "hello"], "no running deployment recorded"),
    (["stats"], "no running deployment recorded"),
    (["stats", "--url", "http://127.0.0.1:9"], "does not answer"),
    (["replay", "/nonexistent.jsonl", "--url", "http://127.0.0.1:9"], "does not exist"),
])
def test_bad_input_is_one_line_and_nonzero(home: Path, args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, args)
    assert result.exit_code != 0
    assert message in result.output
    assert not (home / "cluster.json").exists()


@pytest.mark.parametrize("command", [["replay", str(TRACE)], ["bench"]])
def test_model_means_the_agents_model_as_in_up(home: Path, command: list[str]) -> None:
    # issue 40: against --url, --model meant the served name in replay and was silently ignored by bench.
    result = CliRunner().invoke(main, [*command, "--url", "http://127.0.0.1:9", "--model", "random-tiny"])
    assert result.exit_code == 2 and "--model names the agents' model of --local" in result.output


def test_replay_needs_exactly_one_target(home: Path) -> None:
    result = CliRunner().invoke(main, ["replay", str(TRACE)])
    assert result.exit_code == 2 and "exactly one of --local N and --url URL" in result.output


def test_corrupt_record_is_reported(home: Path) -> None:
    (home / "cluster.json").write_text("{not json")
    result = CliRunner().invoke(main, ["stats"])
    assert result.exit_code == 1 and "not a radixmesh cluster record" in result.output


@pytest.mark.anyio
@pytest.mark.integration
async def test_stats_and_replay_against_a_live_router(router_url: str) -> None:
    # The commands run their own event loops: in a worker thread, beside this test's loop. No model
    # named: replay asks the router which one it serves (issue 40: it sent "radixmesh" and got 404s).
    args = ["replay", str(TRACE), "--url", router_url, "--limit", "8", "--sequential", "--block-size", str(BS),
            "--max-prompt-blocks", "8", "--json"]
    result = await asyncio.to_thread(CliRunner().invoke, main, args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.output.strip().splitlines()[-1])
    assert report["requests"] == 8 and report["prompt_tokens"] == sum(report["hits_by_source"].values())
    stats = await asyncio.to_thread(CliRunner().invoke, main, ["stats", "--url", router_url])
    assert stats.exit_code == 0 and "radixmesh: policy cost" in stats.output
    assert "metadata service: 2 live node(s)" in stats.output


@pytest.mark.anyio
@pytest.mark.integration
async def test_demo_workload_hits_with_caching_and_never_without(router_url: str) -> None:
    workload = DemoWorkload(chats=3, turns=2, systems=1, system_chars=160, max_tokens=2, chats_at_once=3)
    done: list[int] = []
    off = await run_workload(router_url, MODEL_NAME, workload, "off", caching=False, on_done=lambda: done.append(1))
    on = await run_workload(router_url, MODEL_NAME, workload, "on", caching=True, on_done=lambda: done.append(1))
    assert len(done) == 2 * workload.requests and on.requests == off.requests == workload.requests
    assert off.hit_rate == 0.0 and off.hits_by_source["computed"] == off.prompt_tokens
    assert on.prompt_tokens == off.prompt_tokens
    # Turn 2 of every chat and turn 1 of all but the first reuse the shared system prompt at least.
    assert on.hit_rate > 0.3
    assert "global hit rate" in str(comparison_table(on, off).columns[0]._cells)


@pytest.fixture
def up_process(home: Path) -> Iterator[subprocess.Popen[str]]:
    env = {**os.environ, "RADIXMESH_HOME": str(home)}
    exe = Path(sys.executable).with_name("radixmesh")
    # INFO, as a user runs it: the console shows `up`'s phases and the actors' access log.
    with (home / "console.err").open("w") as console:
        proc = subprocess.Popen([str(exe), "up", "--local", "2", "--port", "0"], env=env,
                                stdout=subprocess.PIPE, stderr=console, text=True)
    yield proc
    if proc.poll() is None:
        proc.kill()
        proc.wait()


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(240)
def test_up_route_stats_down_end_to_end(home: Path, up_process: subprocess.Popen[str]) -> None:
    assert up_process.stdout is not None
    for line in up_process.stdout:  # readiness is the command's own line, not a sleep
        if line.startswith("router: "):
            break
    else:
        raise AssertionError(f"`up` exited with {up_process.wait()}")
    assert (home / "cluster.json").exists()
    # The router listed itself and both agents for Prometheus before `up` said it was up.
    targets = json.loads((home / "prometheus" / "targets.json").read_text())
    assert [t["labels"].get("node") for t in targets] == [None, "node-0", "node-1"]
    runner = CliRunner()
    prompt = "radixmesh routes each request to where its prefix already is, so this prompt is reused."
    first = runner.invoke(main, ["route", prompt, "--max-tokens", "2"])
    assert first.exit_code == 0, first.output
    second = runner.invoke(main, ["route", prompt, "--max-tokens", "2"])
    node = next(line.split()[1] for line in first.output.splitlines() if line.startswith("node"))
    blocks = (len(prompt) - 1) // 16
    # The prefix is reused: the cost policy went back to the holder, or (when the holder's load
    # report, on a busy box, priced its queue above a pull) pulled the holder's blocks to its peer.
    went_back = f"node       {node}" in second.output and f"local gpu {blocks * 16}," in second.output
    assert went_back or f"{blocks} pulled from {node}" in second.output, second.output
    assert "the prompt is empty" in runner.invoke(main, ["route", ""]).output
    stats = runner.invoke(main, ["stats", "--json"])
    assert '"requests": 2' in stats.output
    # `up` told each phase, then printed the router's access log (issue 40): plain lines, no Ray ids.
    console = home / "console.err"
    wait_for("the access log on up's console", lambda: "POST /radixmesh/route 200" in console.read_text(), 60)
    text = console.read_text()
    for phase in ("starting a local Ray for 2", "metadata service on 127.0.0.1:", "agent node-0 ready: KV pool 1024",
                  "agent node-1 ready", "router on http://127.0.0.1:", "logs: "):
        assert phase in text, text
    access = next(line for line in text.splitlines() if "POST /radixmesh/route 200" in line)
    assert "radixmesh.access" in access and "job_id=" not in access and "worker_id=" not in access
    down = runner.invoke(main, ["down"])
    assert down.exit_code == 0 and "radixmesh is down" in down.output
    assert up_process.wait(timeout=60) == 0
    assert not (home / "cluster.json").exists()


def test_options_come_from_a_config_file_and_the_environment(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = home / "radixmesh.yaml"
    config.write_text("up:\n  local: 0\n")
    from_file = CliRunner().invoke(main, ["--config", str(config), "up"])
    assert from_file.exit_code != 0 and "0 is not in the range" in from_file.output  # the file's value was used
    monkeypatch.setenv("RADIXMESH_UP_LOCAL", "0")
    from_env = CliRunner().invoke(main, ["up"])
    assert from_env.exit_code != 0 and "0 is not in the range" in from_env.output
    # The command line wins over both: --local 2 is fine, so the next check (the state URL) speaks.
    cli_wins = CliRunner().invoke(main, ["--config", str(config), "up", "--local", "2", "--state", "mysql://x"])
    assert cli_wins.exit_code != 0 and "state must be 'memory' or a redis:// URL" in cli_wins.output


@pytest.mark.parametrize("text, message", [
    ("up:\n  gpu-blokcs: 3\n", "`up` has no option 'gpu-blokcs'"),
    ("upp:\n  local: 2\n", "'upp' is not a command with options (commands: admin-key, bench, bench-trace, ca-cert, demo, down, front, kv-events-keys, metadata-server,"),
    ("- up\n", "must map command names"),
    ("up: [unclosed\n", "cannot read"),
])
def test_a_bad_config_file_is_one_clear_error(home: Path, text: str, message: str) -> None:
    config = home / "bad.yaml"
    config.write_text(text)
    result = CliRunner().invoke(main, ["--config", str(config), "up"])
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output


def test_help_names_each_option_s_environment_variable() -> None:
    result = CliRunner().invoke(main, ["up", "--help"])
    assert result.exit_code == 0 and "RADIXMESH_UP_GPU_BLOCKS" in result.output
