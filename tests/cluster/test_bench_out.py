"""Where `radixmesh bench` writes by default, and what it tells before it starts: a run from a checkout
must not overwrite the committed figures in bench/results."""

import datetime
from pathlib import Path

import pytest
from click.testing import CliRunner

from radixmesh.cluster.bench.arms import ARMS
from radixmesh.cluster.bench.runner import BenchPlan, RateLadder
from radixmesh.cluster.bench.workloads import ChatWorkload
from radixmesh.cluster.cli.bench import fresh_out_dir
from radixmesh.cluster.cli.main import main

NOON = datetime.datetime(2026, 3, 4, 12, 0, 5)


def test_the_default_folder_is_new_per_run(tmp_path: Path) -> None:
    first = fresh_out_dir(tmp_path, NOON)
    assert first == tmp_path / "run-20260304-120005"
    first.mkdir()
    assert fresh_out_dir(tmp_path, NOON) == tmp_path / "run-20260304-120005-2"  # same second: never reused


def test_the_expected_duration_spans_the_given_rates_to_the_knee_searchs_bound() -> None:
    arms = (ARMS["cost"], ARMS["off"])
    fixed = BenchPlan(ChatWorkload(), arms, (1.0, 2.0), duration_s=40, ramp_s=20, drain_s=10)
    assert fixed.expected_s() == (2 * 2 * 60, 2 * 2 * 70)
    search = BenchPlan(ChatWorkload(), arms, (1.0, 2.0), duration_s=40, ramp_s=20, drain_s=10,
                       ladder=RateLadder(max_rates=5))
    assert search.expected_s() == (2 * 2 * 60, 2 * 5 * 70)


def test_bench_says_where_results_go_and_leaves_bench_results_alone(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # a checkout, with the README's committed figures
    committed = Path("bench/results/bench.json")
    committed.parent.mkdir(parents=True)
    committed.write_text("the README's figures")
    # Port 9 refuses at once: the bench stops at its first cell, after telling where it would write.
    result = CliRunner().invoke(main, ["bench", "--url", "http://127.0.0.1:9", "--arms", "cost,off", "--rates", "1",
                                       "--fixed-rates", "--duration", "30", "--ramp", "0", "--drain", "0"])
    assert result.exit_code != 0, result.output
    assert "results go to bench/results/run-" in result.output
    assert "expect 60 s of arrivals" in result.output  # 2 arms x 1 rate x 30 s
    assert committed.read_text() == "the README's figures"
