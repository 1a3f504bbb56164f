"""Each routing decision's prediction beside what happened, and the report over a run: how far each
price the policy used came true, and what the decisions that left a longer cached prefix behind bought.

Kept per served request in a bounded ring (`seq` numbers them, so a caller can ask for the decisions
after a point): TTFT, wait, pull and prefill tokens, estimated vs realized, and what a decision left
behind. Calibration is realized / predicted, median and p90. What each figure compares:
docs/routing.md#decision-calibration.
"""

import collections
import itertools
import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from radixmesh.cluster.policy.step import RoutingStep

DEFAULT_CAPACITY = 16384
"""Outcomes kept: a bench cell's window at a few hundred requests a second; memory ~2 MiB."""
MARGIN_WINDOW = 256
"""Latest outcomes the move margin is read from: recent enough to follow the load."""
MARGIN_MIN_OUTCOMES = 16
"""Fewer outcomes than this give no margin: a quantile of a handful would be noise."""
MARGIN_QUANTILE = 0.9
"""Which absolute TTFT error the move margin is read from: a move that buys more than nine in ten
estimates' errors (of a difference of two, see DIFFERENCE_SPREAD) is a gain the estimates can tell
from their noise."""
DIFFERENCE_SPREAD = 2 ** 0.5
"""A move's gain is the difference of two estimates (at the longest holder, at the node it moves to):
each errs by up to the quantile, and errors independent of each other with one spread give their
difference sqrt(2) times that spread."""
PULL_WINDOW = 64
"""Latest pulls the pull time factor is read from (pulls are a few in a hundred decisions)."""
PULL_MIN_OUTCOMES = 8
"""Fewer measured pulls than this leave pulls priced at their wire time."""
WAIT_WINDOW = MARGIN_WINDOW
"""Latest decisions the wait time factor is read from."""
WAIT_MIN_OUTCOMES = MARGIN_MIN_OUTCOMES
"""Fewer decisions than this leave waits priced by the nodes' measured rates alone."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """One served request: what its routing decision predicted and what was measured."""

    seq: int
    predicted_ttft_s: float
    realized_ttft_s: float
    predicted_wait_s: float
    """Estimated queue + prefill (+ tier reads): the TTFT less the pull."""
    realized_wait_s: float
    predicted_pull_s: float
    realized_pull_s: float
    predicted_computed: int
    """Prompt tokens the decision expected the node to prefill."""
    realized_computed: int
    left_tokens: int
    """Cached prompt tokens on some candidate beyond what this decision reused (0: it took the longest)."""
    bought_s: float | None
    """Estimated TTFT at the longest holder minus at the chosen node (None: not priced, or not left)."""


def _quantiles(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    values = sorted(values)
    p90 = values[min(len(values) - 1, int(0.9 * len(values)))]
    return {"n": len(values), "p50": statistics.median(values), "p90": p90}


def _ratios(pairs: Iterable[tuple[float, float]]) -> dict[str, float] | None:
    """realized / predicted over the pairs whose prediction is > 0."""
    return _quantiles([r / p for p, r in pairs if p > 0])


class Calibration:
    """The latest outcomes and their report."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self._outcomes: collections.deque[Outcome] = collections.deque(maxlen=capacity)
        self._pull_ratios: collections.deque[float] = collections.deque(maxlen=PULL_WINDOW)
        """realized / wire time of the latest served pulls."""
        self._wait_ratios: collections.deque[float] = collections.deque(maxlen=WAIT_WINDOW)
        """realized / unscaled predicted wait of the latest decisions."""
        self.seq = 0
        """The last outcome's number (0: none yet)."""

    def add(self, *, predicted_ttft_s: float, realized_ttft_s: float, predicted_pull_s: float,
            realized_pull_s: float, pull_time_factor: float, wait_time_factor: float, agent_ttft_s: float,
            predicted_computed: int, realized_computed: int, left_tokens: int, bought_s: float | None) -> None:
        """`pull_time_factor`, `wait_time_factor`: the factors the decision was priced with (its
        ClusterView's), so the next factors are read against the prices before them, not against
        prices they already scaled."""
        self.seq += 1
        if predicted_pull_s > 0:
            self._pull_ratios.append(realized_pull_s * pull_time_factor / predicted_pull_s)
        predicted_wait = max(0.0, predicted_ttft_s - predicted_pull_s)
        realized_wait = max(0.0, agent_ttft_s - realized_pull_s)
        if predicted_wait > 0:
            self._wait_ratios.append(realized_wait * wait_time_factor / predicted_wait)
        self._outcomes.append(Outcome(
            self.seq, predicted_ttft_s, realized_ttft_s, predicted_wait, realized_wait, predicted_pull_s,
            realized_pull_s, predicted_computed, realized_computed, left_tokens, bought_s))

    def move_margin_s(self) -> float:
        """sqrt(2) (DIFFERENCE_SPREAD) times the 90th percentile (MARGIN_QUANTILE) of the absolute TTFT
        errors of the latest MARGIN_WINDOW decisions, 0 before MARGIN_MIN_OUTCOMES: how far apart two
        estimates must be before the router believes the difference (ClusterView.move_margin_s).

        Without a margin, the modeled H100 knee bench showed 13-28% of `cost`'s convo decisions
        leaving a conversation's holder to buy an estimated 0.09-0.16 s (p50), while single estimates
        missed by 0.07-0.09 s at p50: the moves bought noise and cost up to 9.5 points of hit rate. At
        the median error the moves that remained claimed ~0.4-0.5 s (p50) against a 90th-percentile
        error of 0.4-0.8 s, and still cost 5-7 points of hit rate for no better TTFT: the median let
        half the estimates' noise through. At one estimate's error (no sqrt(2)), on the agent
        workload (8 modeled H100 agents at 0.01x, 22.5 req/s, with decodes priced) 11.7% of `cost`'s
        decisions still left a session's node, for 0.82x prefix affinity's goodput; at the difference's
        spread, 4.2% and 1.00x, TTFT p50 6.9 s against affinity's 8.5 s (docs/benchmarks.md)."""
        n = len(self._outcomes)
        if n < MARGIN_MIN_OUTCOMES:
            return 0.0
        recent = itertools.islice(self._outcomes, max(0, n - MARGIN_WINDOW), None)
        errors = sorted(abs(o.realized_ttft_s - o.predicted_ttft_s) for o in recent)
        return DIFFERENCE_SPREAD * errors[min(len(errors) - 1, int(MARGIN_QUANTILE * len(errors)))]

    def pull_time_factor(self) -> float:
        """The median realized time over wire time (the price before any factor) of the latest
        PULL_WINDOW pulls (1 before PULL_MIN_OUTCOMES): the factor ClusterView.pull_time_factor prices
        the next pulls with.

        Read over the price the factor had already scaled, it fed back on itself (a pull priced at
        f x wire that takes s x wire reads s / f, so the median settles where f = s / f): with pulls
        taking twice their wire time it went 1, 2, 1.5 and held at sqrt(2), pricing them at 0.71x.

        A pull's priced time is its wire time at the rates measured per peer; its realized time, from
        its blocks' allocation to their landing, also holds what those averages leave out (the
        link's other pulls, each peer's lock taken in turn; the landing job on the puller's engine;
        the cores the agents share). Unscaled, on 8 modeled H100 agents at
        0.01x the pulls of `cost` took 1.2-2.3x their price at the median (agent 22.5 and 33.75 req/s,
        convo 45.6 req/s; p90 2.3-4.0x): the policy pulled where recomputing, or staying, was as fast
        (docs/routing.md#the-cost-model)."""
        if len(self._pull_ratios) < PULL_MIN_OUTCOMES:
            return 1.0
        return statistics.median(self._pull_ratios)

    def wait_time_factor(self) -> float:
        """The median realized wait (the agent's TTFT less its pull) over the wait predicted at the
        nodes' measured rates, of the latest WAIT_WINDOW decisions (1 before WAIT_MIN_OUTCOMES): the
        factor ClusterView.wait_time_factor slows the next decisions' nodes by.

        The nodes' rates and step floors time their engines' steps; a request also waits for what
        those leave out: the agents' host loops, events and RPCs on shared cores, the step in progress
        when it arrives. On 8 modeled H100 agents on a 2-core box the realized TTFT was 1.21x the
        predicted at the median (convo at 28/s), while the engine simulator, which has no host, read
        0.58-0.97 for the same model: a constant in the cost model fits one of them only
        (docs/routing.md#the-cost-model)."""
        if len(self._wait_ratios) < WAIT_MIN_OUTCOMES:
            return 1.0
        return statistics.median(self._wait_ratios)

    def tune(self, step: RoutingStep) -> None:
        """Sets `step`'s next decisions to what the outcomes so far say: the move margin and the pull
        and wait time factors (the router and the engine simulator each call it after `add`)."""
        step.move_margin_s = self.move_margin_s()
        step.pull_time_factor = self.pull_time_factor()
        step.wait_time_factor = self.wait_time_factor()

    def report(self, after: int = 0) -> dict[str, object]:
        """The report over the outcomes numbered > `after` still held (`first_seq` says where they
        start: later than after + 1 when the ring dropped some)."""
        kept = [o for o in self._outcomes if o.seq > after]
        left = [o for o in kept if o.left_tokens > 0]
        return {
            "decisions": len(kept),
            "first_seq": kept[0].seq if kept else None,
            "last_seq": self.seq,
            "calibration": {
                "ttft": _ratios((o.predicted_ttft_s, o.realized_ttft_s) for o in kept),
                "wait": _ratios((o.predicted_wait_s, o.realized_wait_s) for o in kept),
                "pull": _ratios((o.predicted_pull_s, o.realized_pull_s) for o in kept if o.predicted_pull_s > 0),
                "prefill_tokens": _ratios((o.predicted_computed, o.realized_computed) for o in kept),
            },
            "factors": {"pull_time": self.pull_time_factor(), "wait_time": self.wait_time_factor()},
            "ttft_abs_error_s": _quantiles([abs(o.realized_ttft_s - o.predicted_ttft_s) for o in kept]),
            "prefill_tokens": {"predicted": sum(o.predicted_computed for o in kept),
                               "realized": sum(o.realized_computed for o in kept)},
            "left_behind": {
                "decisions": len(left),
                "share": len(left) / len(kept) if kept else 0.0,
                "tokens": sum(o.left_tokens for o in left),
                "bought_s": _quantiles([o.bought_s for o in left if o.bought_s is not None]),
                "realized_ttft_s": _quantiles([o.realized_ttft_s for o in left]),
            },
        }
