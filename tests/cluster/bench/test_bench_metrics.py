"""The bench's figures against simple oracles: goodput and attainment counted by hand, percentiles
against numpy's inverted-CDF (nearest-rank) percentile, the knee, the ratios and the headline."""

import json
import random
import sys
from pathlib import Path

import numpy as np
import pytest

from radixmesh.cluster.bench import report
from radixmesh.cluster.bench.client import Outcome, RequestResult
from radixmesh.cluster.bench.metrics import Slo, goodput, summarise
from radixmesh.cluster.sim.simulator import percentile

SLO = Slo(ttft_s=1.0, itl_s=0.1)


def ok(i: int, ttft: float, e2e: float, tokens: int = 5, gaps: tuple[float, ...] = ()) -> RequestResult:
    return RequestResult(i, Outcome.OK, ttft, gaps, e2e, tokens)


def test_a_request_meets_the_slo_only_when_completed_within_both_bounds() -> None:
    results = [
        ok(0, 0.5, 0.5 + 4 * 0.1),     # TTFT and TPOT exactly at the bounds: met
        ok(1, 1.01, 1.2),              # TTFT over
        ok(2, 0.2, 0.2 + 4 * 0.11),    # TPOT over
        ok(3, 0.9, 0.9, tokens=1),     # one token: no TPOT to miss
        RequestResult(4, Outcome.REFUSED), RequestResult(5, Outcome.FAILED), RequestResult(6, Outcome.UNFINISHED),
    ]
    assert [SLO.met(r) for r in results] == [True, False, False, True, False, False, False]
    assert goodput(results, SLO, 4.0) == 2 / 4.0


def test_summary_counts_add_up_and_match_a_hand_count() -> None:
    results = [ok(0, 0.5, 0.9, gaps=(0.1, 0.1, 0.1, 0.1)), ok(1, 3.0, 3.4, gaps=(0.1, 0.1, 0.1, 0.1)),
               RequestResult(2, Outcome.REFUSED)]
    delta = {"requests": 2, "prompt_tokens": 1000, "local_gpu": 450, "local_host": 0, "local_disk": 50, "remote": 100,
             "computed": 400}
    s = summarise(results, offered=4, slo=SLO, window_s=2.0, stats_delta=delta, turns={0: 0, 1: 2, 2: 1})
    assert s["requests"] == {"offered": 4, "ok": 2, "refused": 1, "failed": 0, "unfinished": 1}
    assert s["goodput_rps"] == 0.5 and s["slo_attainment"] == 0.25
    assert s["ttft_s"] == {"p50": 0.5, "p90": 3.0, "p99": 3.0}
    assert s["ttft_later_turns_s"] == {"p50": 3.0, "p90": 3.0, "p99": 3.0}  # request 1 alone: a third turn
    assert s["output_tokens_per_s"] == 10 / 2.0
    assert s["hit_rate"] == pytest.approx(0.6)
    assert s["hit_rate_by_source"] == {"local_gpu": 0.45, "local_host": 0.0, "local_disk": 0.05, "remote": 0.1}
    assert s["prompt_tokens_computed"] == 400


@pytest.mark.parametrize("n", [1, 2, 7, 100, 1001])
def test_percentiles_are_nearest_rank(n: int) -> None:
    rng = random.Random(n)
    values = [rng.expovariate(1.0) for _ in range(n)]
    for q in (50, 90, 99):
        assert percentile(values, q) == np.percentile(values, q, method="inverted_cdf")


def cell(arm: str, rate: float, goodput_rps: float, p99: float, attainment: float = 1.0) -> dict[str, object]:
    return {"arm": arm, "rate_rps": rate, "interrupted": False, "goodput_rps": goodput_rps,
            "slo_attainment": attainment, "ttft_s": {"p50": p99 / 2, "p90": p99, "p99": p99}}


CELLS = [
    cell("cost", 1.0, 1.0, 0.5), cell("round_robin", 1.0, 0.8, 1.0), cell("prefix_affinity", 1.0, 0.9, 0.6),
    cell("off", 1.0, 0.5, 2.0),
    cell("cost", 2.0, 1.9, 1.0, attainment=0.95), cell("round_robin", 2.0, 0.9, 4.0),
    cell("prefix_affinity", 2.0, 1.5, 0.9), cell("off", 2.0, 0.4, 8.0),
    cell("cost", 4.0, 2.0, 9.0, attainment=0.5), cell("round_robin", 4.0, 0.5, 9.0),
    cell("prefix_affinity", 4.0, 1.0, 9.0), cell("off", 4.0, 0.1, 8.5),
]


def test_the_knee_is_the_highest_rate_where_cost_meets_the_slo_for_most_requests() -> None:
    k = report.knee(CELLS, attainment=0.9)
    assert k is not None and (k["rate_rps"], k["met"], k["at_highest_rate_run"]) == (2.0, True, False)
    top = report.knee(CELLS[:8], attainment=0.9)  # without the 4/s cells, 2/s is the highest rate run
    assert top is not None and (top["rate_rps"], top["at_highest_rate_run"]) == (2.0, True)
    none_met = report.knee([cell("cost", 1.0, 0.1, 5.0, attainment=0.2)], attainment=0.9)
    assert none_met is not None and (none_met["rate_rps"], none_met["met"]) == (1.0, False)
    assert report.knee([cell("off", 1.0, 0.1, 5.0)], attainment=0.9) is None


def test_the_headline_compares_cost_at_the_knee_and_names_cache_arms_worse_than_off() -> None:
    head = report.headline(report.with_ratios(CELLS), "chat", attainment=0.9)
    assert head is not None
    assert head["goodput_cost_over_round_robin"] == pytest.approx(1.9 / 0.9)
    assert head["goodput_cost_over_prefix_affinity"] == pytest.approx(1.9 / 1.5)
    assert head["ttft_p99_cost_over_off"] == pytest.approx(1.0 / 8.0)
    assert head["goals_met"] == {"goodput_cost_over_round_robin": True, "goodput_cost_over_prefix_affinity": True,
                                 "ttft_p99_cost_over_off": True}
    assert head["cache_arms_worse_than_off_on_ttft_p99"] == [
        {"arm": a, "rate_rps": 4.0} for a in ("cost", "round_robin", "prefix_affinity")]


def seeded(arm: str, rate: float, seed: int, goodput_rps: float, attainment: float) -> dict[str, object]:
    c = cell(arm, rate, goodput_rps, 2.0 * goodput_rps, attainment)
    counts = {"offered": 10, "ok": 9, "refused": 1, "failed": 0, "unfinished": 0}
    return {**c, "seed": seed, "order": 0, "hit_rate": attainment / 2, "output_tokens_per_s": 8 * goodput_rps,
            "prompt_tokens": 100, "prompt_tokens_computed": 10, "cached_tokens_reported": 90,
            "router_requests": 10, "regret_tokens": 0, "requests": counts,
            **{k: {"p50": goodput_rps} for k in ("ttft_later_turns_s", "itl_s", "e2e_s")}}


def test_cells_at_several_seeds_are_read_at_their_means() -> None:
    """At one seed cost's knee is 2/s (its 0.95 there); at the other, 1/s: their mean (0.85 at 2/s) puts
    the knee at 1/s, and the headline compares the means there."""
    cells = [seeded("cost", 1.0, 0, 1.0, 1.0), seeded("prefix_affinity", 1.0, 0, 0.8, 0.9),
             seeded("cost", 2.0, 0, 1.9, 0.95), seeded("cost", 1.0, 1, 0.9, 0.92),
             seeded("prefix_affinity", 1.0, 1, 0.6, 0.7), seeded("cost", 2.0, 1, 1.5, 0.75)]
    doc = report.document({}, cells, workload="chat", attainment=0.9, interrupted=False, complete=True)
    means = {(m["arm"], m["rate_rps"]): m for m in doc["means"]}
    cost1 = means[("cost", 1.0)]
    assert cost1["goodput_rps"] == pytest.approx(0.95) and cost1["spread"]["goodput_rps"] == [0.9, 1.0]
    assert cost1["seeds"] == [0, 1] and cost1["requests"]["offered"] == 20 and cost1["prompt_tokens"] == 200
    assert cost1["ttft_s"]["p99"] == pytest.approx(1.9) and means[("cost", 2.0)]["slo_attainment"] == pytest.approx(0.85)
    assert len(doc["cells"]) == 6  # every seed's cell kept
    head = doc["headline"]
    assert head["knee"]["rate_rps"] == 1.0
    assert head["goodput_cost_over_prefix_affinity"] == pytest.approx(0.95 / 0.7)
    one_seed = report.document({}, cells[:3], workload="chat", attainment=0.9, interrupted=False, complete=True)
    assert "means" not in one_seed and one_seed["headline"]["knee"]["rate_rps"] == 2.0


def test_ratios_are_null_where_the_baseline_is_missing_or_zero() -> None:
    cells = report.with_ratios([cell("cost", 1.0, 1.0, 0.5), cell("off", 1.0, 0.0, 2.0)])
    assert cells[0]["ratios"] == {"goodput_over_off": None, "ttft_p99_over_off": 0.25}
    head = report.headline(cells, "chat", attainment=0.9)
    assert head is not None and head["goodput_cost_over_round_robin"] is None


def test_ttft_percentiles_count_unfinished_requests_with_their_wait_as_a_lower_bound() -> None:
    # an overloaded arm: one request served fast, three still waiting for a first token at the end
    results = [ok(0, 0.2, 0.3), RequestResult(1, Outcome.UNFINISHED, 30.0, ttft_censored=True),
               RequestResult(2, Outcome.UNFINISHED, 25.0, ttft_censored=True),
               RequestResult(3, Outcome.UNFINISHED, 4.0),  # had its first token, not its last
               RequestResult(4, Outcome.REFUSED)]
    s = summarise(results, offered=5, slo=SLO, window_s=10.0, stats_delta={},
                  turns=dict.fromkeys(range(5), 1))
    assert s["ttft_s"] == {"p50": 4.0, "p90": 30.0, "p99": 30.0}
    assert s["ttft_lower_bounds"] == 2
    assert s["ttft_later_turns_s"] == s["ttft_s"]  # every one a later turn
    assert s["e2e_s"] == {"p50": 0.3, "p99": 0.3}  # end to end: completed requests only


def test_without_matplotlib_the_json_is_written_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now raises ImportError
    doc = report.document({"slo": {"ttft_s": 1.0, "itl_s": 0.1}}, [], workload="chat", attainment=0.9,
                          interrupted=False, complete=True)
    json_path, png_path = report.write(doc, tmp_path)
    assert png_path is None and not (tmp_path / "bench.png").exists()
    assert json.loads(json_path.read_text())["headline"] is None
