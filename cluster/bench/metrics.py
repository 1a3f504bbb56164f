"""What one cell (an arm at an offered rate) measured: goodput against the SLOs, latency percentiles,
hit rate by source, outcomes.

Definitions (also written into the JSON):
- a request meets the SLO when it completed, its TTFT <= slo.ttft_s, and its time per output token
  after the first (TPOT, (end to end - TTFT) / (tokens - 1)) <= slo.itl_s;
- goodput = requests that met the SLO / the arrival window (so it is at most the offered rate);
- attainment = requests that met the SLO / requests offered;
- percentiles are nearest-rank over completed requests (inter-token: over every gap of every one),
  except TTFT's, which also count the requests still unfinished at the cell's end: with their TTFT,
  or, still waiting for a first token, with the time they had waited (a lower bound), so an arm
  that falls behind shows it in its TTFT instead of dropping its slowest requests.
- later turns' TTFT: the same percentiles over the second and later turns of each session only,
  the requests whose conversation a previous turn left cached somewhere (a split deployment's
  decode agent, for one).
"""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from radixmesh.cluster.bench.client import Outcome, RequestResult
from radixmesh.cluster.sim.simulator import percentile
from radixmesh.proto.serve.tokens import HIT_SOURCES


@dataclass(frozen=True, slots=True)
class Slo:
    ttft_s: float = 2.0
    itl_s: float = 0.5
    """Per request: its mean time per output token after the first."""

    def __post_init__(self) -> None:
        if not (self.ttft_s > 0 and self.itl_s > 0):
            raise ValueError(f"SLOs must be > 0, got ttft {self.ttft_s} and inter-token {self.itl_s}")

    def met(self, r: RequestResult) -> bool:
        return r.outcome is Outcome.OK and r.ttft_s is not None and r.ttft_s <= self.ttft_s and r.tpot_s <= self.itl_s


def goodput(results: Sequence[RequestResult], slo: Slo, window_s: float) -> float:
    """Requests per second that met `slo` over a `window_s`-long arrival window."""
    return sum(slo.met(r) for r in results) / window_s if window_s > 0 else 0.0


def _quantiles(values: Sequence[float], qs: Sequence[int]) -> dict[str, float]:
    return {f"p{q}": percentile(values, q) for q in qs}


def _ttft_quantiles(results: Iterable[RequestResult]) -> dict[str, float]:
    return _quantiles([r.ttft_s for r in results if r.outcome in (Outcome.OK, Outcome.UNFINISHED)
                       and r.ttft_s is not None], (50, 90, 99))


def summarise(results: Sequence[RequestResult], offered: int, slo: Slo, window_s: float,
              stats_delta: Mapping[str, int], turns: Mapping[int, int]) -> dict[str, Any]:
    """The cell's figures. `offered` counts every request whose arrival came (sent or not, when the
    bench was stopped); `stats_delta` is the router's /stats counters over the cell (after - before);
    `turns`, each result's turn in its session (0: the first) by request index."""
    ok = [r for r in results if r.outcome is Outcome.OK]
    counts = {o.value: sum(r.outcome is o for r in results) for o in Outcome}
    counts["unfinished"] += offered - len(results)  # arrivals the bench never sent (stopped)
    prompt = stats_delta.get("prompt_tokens", 0)
    computed = stats_delta.get("computed", 0)
    return {
        "requests": {"offered": offered, **counts},
        "goodput_rps": goodput(results, slo, window_s),
        "slo_attainment": sum(slo.met(r) for r in results) / offered if offered else 0.0,
        "ttft_s": _ttft_quantiles(results),
        "ttft_later_turns_s": _ttft_quantiles(r for r in results if turns[r.index] > 0),
        "ttft_lower_bounds": sum(r.ttft_censored for r in results),
        "itl_s": _quantiles([g for r in ok for g in r.gaps_s], (50, 99)),
        "e2e_s": _quantiles([r.e2e_s for r in ok if r.e2e_s is not None], (50, 99)),
        "output_tokens_per_s": sum(r.output_tokens for r in ok) / window_s if window_s > 0 else 0.0,
        "prompt_tokens": prompt,
        "prompt_tokens_computed": computed,
        "hit_rate": (prompt - computed) / prompt if prompt else 0.0,
        "hit_rate_by_source": {s: stats_delta.get(s, 0) / prompt if prompt else 0.0
                               for s in HIT_SOURCES},
        "cached_tokens_reported": sum(r.cached_tokens for r in ok),
        "router_requests": stats_delta.get("requests", 0),
        # tokens the index saw cached somewhere in the cluster and the serving node recomputed anyway
        "regret_tokens": stats_delta.get("regret_tokens", 0),
    }
