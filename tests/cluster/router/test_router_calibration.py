"""The router's calibration report (cluster/router/calibration.py) against an oracle: ratios and
quantiles recomputed from the outcomes added, the window after a decision number, the ring's bound."""

import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from radixmesh.cluster.router.calibration import (
    MARGIN_MIN_OUTCOMES,
    MARGIN_WINDOW,
    PULL_MIN_OUTCOMES,
    PULL_WINDOW,
    WAIT_MIN_OUTCOMES,
    WAIT_WINDOW,
    Calibration,
)

outcome = st.fixed_dictionaries({
    "predicted_ttft_s": st.floats(0.0, 10.0), "realized_ttft_s": st.floats(0.0, 10.0),
    "predicted_pull_s": st.floats(0.0, 1.0), "realized_pull_s": st.floats(0.0, 1.0),
    "pull_time_factor": st.floats(0.1, 10.0), "wait_time_factor": st.floats(0.1, 10.0),
    "agent_ttft_s": st.floats(0.0, 10.0), "predicted_computed": st.integers(0, 4096),
    "realized_computed": st.integers(0, 4096), "left_tokens": st.integers(0, 512),
    "bought_s": st.none() | st.floats(-5.0, 5.0)})


@given(st.lists(outcome, max_size=40), st.integers(0, 45), st.integers(1, 50))
def test_the_report_matches_an_oracle_over_the_kept_window(added: list[dict], after: int, capacity: int) -> None:  # type: ignore[type-arg]
    cal = Calibration(capacity)
    for o in added:
        cal.add(**o)
    report = cal.report(after)
    numbered = list(enumerate(added, start=1))[-capacity:]  # the ring keeps the latest `capacity`
    kept = [o for seq, o in numbered if seq > after]
    assert report["decisions"] == len(kept) and report["last_seq"] == len(added)
    assert report["first_seq"] == (next(seq for seq, _ in numbered if seq > after) if kept else None)
    ratios = [o["realized_ttft_s"] / o["predicted_ttft_s"] for o in kept if o["predicted_ttft_s"] > 0]
    ttft = report["calibration"]["ttft"]  # type: ignore[index]
    if ratios:
        assert ttft["n"] == len(ratios) and ttft["p50"] == statistics.median(ratios)
        assert ttft["p90"] == sorted(ratios)[min(len(ratios) - 1, int(0.9 * len(ratios)))] >= min(ratios)
    else:
        assert ttft is None
    pulls = [o for o in kept if o["predicted_pull_s"] > 0]
    assert (report["calibration"]["pull"] or {"n": 0})["n"] == len(pulls)  # type: ignore[index]
    assert report["prefill_tokens"] == {"predicted": sum(o["predicted_computed"] for o in kept),
                                        "realized": sum(o["realized_computed"] for o in kept)}
    left = [o for o in kept if o["left_tokens"] > 0]
    behind = report["left_behind"]
    assert behind["decisions"] == len(left) and behind["tokens"] == sum(o["left_tokens"] for o in left)  # type: ignore[index]
    bought = [o["bought_s"] for o in left if o["bought_s"] is not None]
    assert (behind["bought_s"] or {"n": 0})["n"] == len(bought)  # type: ignore[index]


def test_wait_is_the_ttft_less_the_pull_on_each_side() -> None:
    cal = Calibration()
    cal.add(predicted_ttft_s=1.0, realized_ttft_s=1.5, predicted_pull_s=0.2, realized_pull_s=0.3, pull_time_factor=1.0,
            wait_time_factor=1.0, agent_ttft_s=1.3,
            predicted_computed=100, realized_computed=100, left_tokens=0, bought_s=None)
    wait = cal.report()["calibration"]["wait"]  # type: ignore[index]
    assert wait["p50"] == (1.3 - 0.3) / (1.0 - 0.2)


@given(st.lists(st.tuples(st.floats(0.0, 10.0), st.floats(0.0, 10.0)), max_size=300))
def test_the_move_margin_is_sqrt_2_times_the_90th_percentile_error_of_the_latest_window(pairs: list[tuple[float, float]]) -> None:
    cal = Calibration()
    for predicted, realized in pairs:
        cal.add(predicted_ttft_s=predicted, realized_ttft_s=realized, predicted_pull_s=0.0, realized_pull_s=0.0,
                pull_time_factor=1.0, wait_time_factor=1.0, agent_ttft_s=realized, predicted_computed=0, realized_computed=0, left_tokens=0, bought_s=None)
    errors = sorted([abs(r - p) for p, r in pairs][-MARGIN_WINDOW:])
    # sqrt(2) times the error nine in ten of the window's errors are at most (one of them): the
    # spread of a difference of two estimates
    expected = errors[min(len(errors) - 1, int(0.9 * len(errors)))] if len(pairs) >= MARGIN_MIN_OUTCOMES else 0.0
    assert cal.move_margin_s() == pytest.approx(2 ** 0.5 * expected)


@given(st.lists(st.tuples(st.floats(0.0, 1.0), st.floats(0.0, 10.0), st.floats(0.1, 10.0)), max_size=120))
def test_the_pull_time_factor_is_the_median_realized_over_wire_time_of_the_latest_pulls(
        pulls: list[tuple[float, float, float]]) -> None:
    cal = Calibration()
    for predicted, realized, factor in pulls:
        cal.add(predicted_ttft_s=1.0, realized_ttft_s=1.0, predicted_pull_s=predicted, realized_pull_s=realized,
                pull_time_factor=factor, wait_time_factor=1.0, agent_ttft_s=1.0, predicted_computed=0, realized_computed=0, left_tokens=0,
                bought_s=None)
    # Decisions that planned no pull say nothing of pulls; a price is the wire time times its factor.
    ratios = [r * f / p for p, r, f in pulls if p > 0][-PULL_WINDOW:]
    expected = statistics.median(ratios) if len(ratios) >= PULL_MIN_OUTCOMES else 1.0
    assert cal.pull_time_factor() == pytest.approx(expected)


@pytest.mark.parametrize("slowdown", [0.5, 2.0, 3.0])
def test_pulls_priced_with_the_factor_it_gave_keep_it_at_their_slowdown(slowdown: float) -> None:
    """The router's loop: each pull priced at its wire time times the current factor, realized at
    `slowdown` times its wire time. Read over the scaled prices, the factor settled at the square
    root of the slowdown."""
    cal, wire, factors = Calibration(), 0.01, []
    for _ in range(8 * PULL_WINDOW):
        factor = cal.pull_time_factor()
        factors.append(factor)
        cal.add(predicted_ttft_s=1.0, realized_ttft_s=1.0, predicted_pull_s=wire * factor,
                realized_pull_s=wire * slowdown, pull_time_factor=factor, wait_time_factor=1.0, agent_ttft_s=1.0, predicted_computed=0,
                realized_computed=0, left_tokens=0, bought_s=None)
    assert factors[:PULL_MIN_OUTCOMES] == [1.0] * PULL_MIN_OUTCOMES
    assert factors[PULL_MIN_OUTCOMES:] == pytest.approx([slowdown] * (len(factors) - PULL_MIN_OUTCOMES))


@given(st.lists(st.tuples(st.floats(0.0, 10.0), st.floats(0.0, 1.0), st.floats(0.0, 10.0), st.floats(0.1, 10.0)),
                max_size=300))
def test_the_wait_time_factor_is_the_median_realized_over_unscaled_predicted_wait_of_the_latest_decisions(
        decisions: list[tuple[float, float, float, float]]) -> None:
    cal = Calibration()
    for predicted, pull, agent_ttft, factor in decisions:
        cal.add(predicted_ttft_s=predicted, realized_ttft_s=agent_ttft, predicted_pull_s=pull, realized_pull_s=pull,
                pull_time_factor=1.0, wait_time_factor=factor, agent_ttft_s=agent_ttft, predicted_computed=0,
                realized_computed=0, left_tokens=0, bought_s=None)
    # The wait is the TTFT less the pull on each side; a prediction was the unscaled one times its factor.
    ratios = [max(0.0, t - p) * f / (pr - p) for pr, p, t, f in decisions if pr - p > 0][-WAIT_WINDOW:]
    expected = statistics.median(ratios) if len(ratios) >= WAIT_MIN_OUTCOMES else 1.0
    assert cal.wait_time_factor() == pytest.approx(expected)
    assert cal.report()["factors"] == {"pull_time": cal.pull_time_factor(), "wait_time": cal.wait_time_factor()}


@pytest.mark.parametrize("slowdown", [0.6, 1.5])
def test_waits_predicted_with_the_factor_it_gave_keep_it_at_what_they_realize(slowdown: float) -> None:
    """The router's loop for waits: each decision's wait predicted at the nodes' rates times the
    current factor, realized at `slowdown` times the unscaled prediction (host time live, a model
    that over-counts in the simulator): the factor holds at the slowdown once it has its decisions."""
    cal, unscaled, factors = Calibration(), 0.2, []
    for _ in range(4 * WAIT_WINDOW):
        factor = cal.wait_time_factor()
        factors.append(factor)
        cal.add(predicted_ttft_s=unscaled * factor, realized_ttft_s=unscaled * slowdown, predicted_pull_s=0.0,
                realized_pull_s=0.0, pull_time_factor=1.0, wait_time_factor=factor, agent_ttft_s=unscaled * slowdown,
                predicted_computed=0, realized_computed=0, left_tokens=0, bought_s=None)
    assert factors[:WAIT_MIN_OUTCOMES] == [1.0] * WAIT_MIN_OUTCOMES
    assert factors[WAIT_MIN_OUTCOMES:] == pytest.approx([slowdown] * (len(factors) - WAIT_MIN_OUTCOMES))
