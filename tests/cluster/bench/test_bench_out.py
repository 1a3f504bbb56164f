"""Where `radixmesh bench` writes by default, and what it tells before it starts: a run from a checkout
must not overwrite the committed figures in bench/results."""

import datetime
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from radixmesh.cluster.bench.arms import ARMS
from radixmesh.cluster.bench.client import Outcome, RequestResult
from radixmesh.cluster.bench.metrics import Slo, summarise
from radixmesh.cluster.bench.runner import BenchPlan, RateLadder
from radixmesh.cluster.bench.workloads import ChatWorkload
from radixmesh.cluster.cli.bench import fresh_out_dir
from radixmesh.cluster.cli.bench_view import results_table
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


def test_a_cell_whose_requests_all_stayed_unfinished_says_so_and_shows_no_hit_rate() -> None:
    # issue 40: on a busy box every request was unfinished, yet the table read "hit rate 0.0%, failed 0".
    slo = Slo(ttft_s=2.0, itl_s=0.5)
    stuck = [RequestResult(i, Outcome.UNFINISHED, ttft_s=30.0, ttft_censored=True) for i in range(5)]
    served = [RequestResult(i, Outcome.OK, ttft_s=0.1, gaps_s=(0.01,), e2e_s=0.2, output_tokens=2) for i in range(4)]
    cells = [{**summarise(stuck, 5, slo, 10.0, {}, dict.fromkeys(range(5), 0)), "arm": "cost", "rate_rps": 2.0,
              "ratios": {}},
             {**summarise(served, 4, slo, 10.0, {"prompt_tokens": 100, "computed": 25},
                         dict.fromkeys(range(4), 0)), "arm": "cost",
              "rate_rps": 1.0, "ratios": {}}]
    console = Console(width=400, record=True)
    console.print(results_table({"settings": {"workload": {"name": "chat"}, "cluster": "2 agents"}, "cells": cells}))
    header, rows = _table_lines(console.export_text())
    by_rate = {row[header.index("rate/s")]: row for row in rows}
    assert by_rate["2"][header.index("unfinished")] == "5" and by_rate["2"][header.index("failed")] == "0"
    assert by_rate["2"][header.index("hit rate")] == "-"  # nothing measured, not a cold cache
    assert by_rate["1"][header.index("unfinished")] == "0" and by_rate["1"][header.index("hit rate")] == "75.0%"


def _table_lines(text: str) -> tuple[list[str], list[list[str]]]:
    """A rich table's header and rows, its cells split on the box's vertical bars."""
    lines = [[cell.strip() for cell in line.strip("│┃ ").split("│" if "│" in line else "┃")]
             for line in text.splitlines() if ("│" in line or "┃" in line)]
    return lines[0], lines[1:]
