"""Running a bench: every arm at every offered rate, one cell at a time, arms interleaved.

Order: rate by rate, ascending; within a rate the arms in a rotated order (rate i starts at arm i),
so a machine that drifts (thermal, a neighbour's job) hits every arm alike and no arm always goes
first. Every cell gets a fresh cluster from `Clusters`, a warm-up (requests salted so they share
nothing with the workload), then the rate's requests at their arrival times: for `ramp_s` seconds
unmeasured (the workload itself warms the caches and brings sessions to their later turns, as on a
service that has been running), then for `duration_s` measured. It ends `drain_s` after the arrival
window, cancelling what still runs (counted as unfinished). Setting `stop` ends the current cell
the same way at once and runs no more.
"""

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NamedTuple, Protocol

import aiohttp

from radixmesh.cluster.bench.arms import Arm, Clusters, Target
from radixmesh.cluster.bench.client import Outcome, RequestResult, complete
from radixmesh.cluster.bench.metrics import Slo, summarise
from radixmesh.cluster.bench.report import seed_means
from radixmesh.cluster.bench.schedule import BenchRequest, Workload, count_sessions, random_tokens, schedule
from radixmesh.cluster.bench.workloads import VOCAB
from radixmesh.cluster.sim.router_client import router_decisions, router_stats
from radixmesh.proto.serve.tokens import SOURCES

WARMUP_PROMPT_TOKENS = 128


@dataclass(frozen=True, slots=True)
class BenchPlan:
    workload: Workload
    arms: tuple[Arm, ...]
    rates: tuple[float, ...]
    """Offered request rates (requests/s), run in ascending order."""
    duration_s: float = 90.0
    """Measured arrival window of each cell."""
    ramp_s: float = 0.0
    """Arrivals sent before the measured window, not measured."""
    drain_s: float = 30.0
    """How long a cell waits after its window for requests still running."""
    warmup: int = 4
    """Warm-up requests per cell (sent two at a time)."""
    slo: Slo = field(default_factory=Slo)
    seed: int = 0
    ladder: "RateLadder | None" = None
    """Find the knee: after `rates`, keep raising the rate (RateLadder) until every caching arm fell below
    `knee_attainment`, past `cost`'s knee by `ladder.past_knee` rates."""
    knee_attainment: float = 0.9
    seeds: int = 1
    """Cells per arm and rate, at seeds seed .. seed + seeds - 1 (each its own requests and, simulated,
    its own router draws); the knee and the headline read their means (report.seed_means)."""

    def __post_init__(self) -> None:
        if not self.arms or not self.rates:
            raise ValueError("a bench needs at least one arm and one rate")
        if self.seeds < 1:
            raise ValueError(f"seeds must be >= 1, got {self.seeds}")
        if len({a.name for a in self.arms}) != len(self.arms):
            raise ValueError("an arm is named twice")
        if min(self.rates) <= 0 or self.duration_s <= 0 or min(self.ramp_s, self.drain_s, self.warmup) < 0:
            raise ValueError("rates and duration must be > 0; ramp, drain and warmup >= 0")

    def cells(self) -> list[tuple[float, Arm, int]]:
        """(rate, arm, seed) of the given rates in the order they run (a ladder's rates follow them)."""
        return [cell for i, rate in enumerate(sorted(self.rates)) for cell in self.rate_cells(i, rate)]

    def rate_cells(self, i: int, rate: float) -> list[tuple[float, Arm, int]]:
        """The cells of the `i`-th rate run: seed by seed, the arms rotated to start at arm i (then i + 1
        at the next seed)."""
        return [(rate, self.arms[(i + j + k) % len(self.arms)], self.seed + j)
                for j in range(self.seeds) for k in range(len(self.arms))]

    def expected_s(self) -> "ExpectedDuration":
        """Seconds the bench's arrivals take, before it starts (cluster starts and warm-ups come on top).
        Shortest: every given cell's ramp and window with no drain; longest: every rate the ladder may add,
        each cell also waiting its whole drain."""
        cell = self.ramp_s + self.duration_s
        rates = max(self.ladder.max_rates, len(self.rates)) if self.ladder is not None else len(self.rates)
        return ExpectedDuration(len(self.cells()) * cell, len(self.arms) * self.seeds * rates * (cell + self.drain_s))


class ExpectedDuration(NamedTuple):
    shortest_s: float
    longest_s: float


@dataclass(frozen=True, slots=True)
class RateLadder:
    """Rates past the given ones, each `factor` times the last, until the knee is behind every cache arm."""

    factor: float = 1.5
    past_knee: int = 2
    """Rates run after the last one at which `cost` met the attainment (so its knee is bracketed)."""
    max_rates: int = 12
    """Rates in all, the given ones included: the bench's bound when no arm ever falls."""

    def __post_init__(self) -> None:
        if not (self.factor > 1 and self.past_knee >= 1 and self.max_rates >= 1):
            raise ValueError("a rate ladder needs factor > 1, past_knee >= 1 and max_rates >= 1")

    def done(self, plan: BenchPlan, cells: Sequence[dict[str, Any]]) -> bool:
        """Whether the rates run so far bracket every caching arm's knee (or the bound is reached), on
        the seeds' means."""
        cells = seed_means(cells)
        rates = sorted({c["rate_rps"] for c in cells})
        if len(rates) >= self.max_rates:
            return True
        met = {(c["arm"], c["rate_rps"]) for c in cells if c["slo_attainment"] >= plan.knee_attainment}
        top = rates[-1]
        if any((a.name, top) in met for a in plan.arms if a.caching):
            return False  # a caching arm still meets the SLO at the highest rate run
        knee_arm = "cost" if any(a.name == "cost" for a in plan.arms) else plan.arms[0].name
        last_met = max((i for i, r in enumerate(rates) if (knee_arm, r) in met), default=-1)
        return len(rates) - 1 - last_met >= self.past_knee


class BenchProgress(Protocol):
    def start(self, totals: dict[str, int]) -> None:
        """The bench starts: each arm will send `totals[arm]` requests over all rates."""

    def cell(self, arm: str, rate: float, requests: int) -> None:
        """A cell of `arm` starts, with `requests` to send."""

    def done(self, arm: str) -> None:
        """One request of the running cell of `arm` ended (any outcome)."""

    def more(self, requests: int) -> None:
        """A rate was added (RateLadder): every arm will send `requests` more."""


SimulatedCell = Callable[[Arm, float, Sequence[BenchRequest], int], dict[str, Any]]
"""A cell replayed in virtual time instead of on a live cluster (engine_sim.simulated_cell): the arm,
the rate, its requests and the seed to the cell's figures."""


async def run_bench(plan: BenchPlan, clusters: Clusters | None, stop: asyncio.Event, progress: BenchProgress,
                    on_cell: Callable[[list[dict[str, Any]]], None],
                    clock: Callable[[], float] = time.monotonic,
                    simulate: SimulatedCell | None = None) -> list[dict[str, Any]]:
    """Every cell of `plan` on `clusters`, or (`simulate`) in the engine simulator; `on_cell` gets the
    cells measured so far after each one (to save them)."""
    cells: list[dict[str, Any]] = []
    seeds = range(plan.seed, plan.seed + plan.seeds)

    def rung(rate: float) -> dict[int, list[BenchRequest]]:
        return {seed: schedule(plan.workload, rate, plan.ramp_s + plan.duration_s, seed) for seed in seeds}

    requests = {rate: rung(rate) for rate in plan.rates}
    progress.start({arm.name: sum(len(r) for by_seed in requests.values() for r in by_seed.values())
                    for arm in plan.arms})
    rates = sorted(plan.rates)
    i = 0
    while i < len(rates) and not stop.is_set():
        rate = rates[i]
        if rate not in requests:  # a ladder's rung: its requests join the bars' totals now
            requests[rate] = rung(rate)
            progress.more(sum(map(len, requests[rate].values())))
        for _, arm, seed in plan.rate_cells(i, rate):
            if stop.is_set():
                break
            sent = requests[rate][seed]
            progress.cell(arm.name, rate, len(sent))
            t0 = clock()
            if simulate is not None:
                # Off the event loop: a cell takes seconds of CPU, and a Ctrl-C must still be heard.
                cell = await asyncio.to_thread(simulate, arm, rate, sent, seed)
                for _ in sent:
                    progress.done(arm.name)
            else:
                assert clusters is not None, "a live bench runs on clusters"
                async with clusters.cluster(arm) as target:
                    if stop.is_set():  # stopped while the cluster started: nothing of this cell was measured
                        break
                    cell = await run_cell(plan, arm, rate, sent, target, stop, partial(progress.done, arm.name),
                                          clock)
            cells.append({"arm": arm.name, "rate_rps": rate, "seed": seed, "order": len(cells),
                          "wall_s": clock() - t0, **cell})
            on_cell(cells)
        i += 1
        if i == len(rates) and plan.ladder is not None and not stop.is_set() and not plan.ladder.done(plan, cells):
            rates.append(rates[-1] * plan.ladder.factor)
    return cells


async def run_cell(plan: BenchPlan, arm: Arm, rate: float, requests: Sequence[BenchRequest], target: Target,
                   stop: asyncio.Event, on_done: Callable[[], None],
                   clock: Callable[[], float] = time.monotonic) -> dict[str, Any]:
    """One arm at one rate against `target`: warm it, send `requests` open-loop (those of the ramp
    unmeasured), drain, summarise."""
    # open loop: the session's connector has no limit, so the client never holds a request back
    async with target.access.session(timeout=aiohttp.ClientTimeout(total=None)) as http:
        await _warm(http, target, plan, rate)
        before = await router_stats(target.url, target.access)

        async def one(r: BenchRequest) -> RequestResult:
            # `off` salts each request apart: no prefix is shared, even on a deployment that caches
            salt = None if arm.caching else f"bench-{plan.seed}-{rate!r}-{r.index}"
            result = await complete(http, target.url, target.model, r, clock, salt)
            on_done()
            return result

        # time 0 is the ramp's start; the measured window is [ramp_s, ramp_s + duration_s)
        t0 = clock()
        tasks: list[asyncio.Task[RequestResult]] = []
        opened = plan.ramp_s <= 0
        before_decisions = await _last_decision(target)
        for r in requests:
            if await _stopped(stop, t0 + r.arrival_s - clock()):
                break
            if not opened and r.arrival_s >= plan.ramp_s:
                # the window opens: what the router counted so far was the ramp's (some of whose
                # requests still run, so the window's counters hold a little of the ramp's end)
                opened, before = True, await router_stats(target.url, target.access)
                before_decisions = await _last_decision(target)
            tasks.append(asyncio.create_task(one(r)))
        interrupted = stop.is_set()
        window = max(0.0, clock() - t0 - plan.ramp_s) if interrupted else plan.duration_s
        await _drain(tasks, stop, t0 + plan.ramp_s + plan.duration_s + plan.drain_s - clock())
        end = clock()
        # a task cancelled before it ran never sent its request: it waited since its arrival
        results = [t.result() if not t.cancelled() else
                   RequestResult(i, Outcome.UNFINISHED, end - t0 - requests[i].arrival_s, ttft_censored=True)
                   for i, t in enumerate(tasks) if requests[i].arrival_s >= plan.ramp_s]
    after = await router_stats(target.url, target.access)
    before = before if opened else after  # stopped during the ramp: nothing was measured
    delta = {k: int(after[k]) - int(before[k]) for k in ("requests", "prompt_tokens", "regret_tokens", *SOURCES)}
    decisions = await router_decisions(target.url, before_decisions if opened else await _last_decision(target),
                                       target.access)
    measured = [r for r in requests if plan.ramp_s <= r.arrival_s < plan.ramp_s + window]
    return {"interrupted": interrupted or stop.is_set(), "window_s": window,
            "ramp_requests": sum(r.arrival_s < plan.ramp_s for r in requests[:len(tasks)]),
            "sessions": count_sessions(measured),
            **summarise(results, len(measured), plan.slo, window, delta, {r.index: r.turn for r in requests}),
            "decisions": decisions,
            "handoff": handoff_delta(before, after)}


def handoff_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """A split arm's hand-offs in the window, from the router's /stats: how many (by outcome), their
    bytes, their time and how much of it overlapped the prefill (docs/disaggregation.md#metrics);
    `overlap` is the overlapped share of the hand-off time. Zeros for an aggregated arm."""
    def outcomes(stats: dict[str, Any]) -> dict[str, int]:
        return {k: int(v) for k, v in stats.get("handoffs", {}).items()}
    counts = {k: n - outcomes(before).get(k, 0) for k, n in outcomes(after).items()}
    seconds = float(after.get("handoff_seconds", 0.0)) - float(before.get("handoff_seconds", 0.0))
    overlap = float(after.get("handoff_overlap_seconds", 0.0)) - float(before.get("handoff_overlap_seconds", 0.0))
    return {"handoffs": {k: n for k, n in counts.items() if n}, "bytes": int(after.get("handoff_bytes", 0)) -
            int(before.get("handoff_bytes", 0)), "seconds": round(seconds, 6), "overlap_seconds": round(overlap, 6),
            "overlap": round(overlap / seconds, 4) if seconds > 0 else None}


async def _last_decision(target: Target) -> int:
    """The number of the router's latest decision: the measured window's report starts after it."""
    return int((await router_decisions(target.url, 0, target.access))["last_seq"])


async def _stopped(stop: asyncio.Event, delay_s: float) -> bool:
    """Wait `delay_s` unless `stop` is set first; whether it is set."""
    if delay_s > 0 and not stop.is_set():
        try:
            async with asyncio.timeout(delay_s):
                await stop.wait()
        except TimeoutError:
            pass
    return stop.is_set()


async def _drain(tasks: Sequence[asyncio.Task[RequestResult]], stop: asyncio.Event, timeout_s: float) -> None:
    """Wait for `tasks` up to `timeout_s` or until `stop`; cancel what still runs."""
    pending = [t for t in tasks if not t.done()]
    if pending and timeout_s > 0 and not stop.is_set():
        waiters = [asyncio.ensure_future(asyncio.wait(pending)), asyncio.ensure_future(stop.wait())]
        await asyncio.wait(waiters, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        for w in waiters:  # cancelling asyncio.wait leaves the tasks it waited on running
            w.cancel()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _warm(http: aiohttp.ClientSession, target: Target, plan: BenchPlan, rate: float) -> None:
    """Requests that share nothing with the workload (salted), two at a time: first-use costs paid."""
    rng = random.Random(f"{plan.seed}/warmup")
    for start in range(0, plan.warmup, 2):
        batch = [BenchRequest(i, 0.0, -1, 0, random_tokens(rng, WARMUP_PROMPT_TOKENS, VOCAB), 4)
                 for i in range(start, min(start + 2, plan.warmup))]
        await asyncio.gather(*(complete(http, target.url, target.model, r, time.monotonic,
                                        f"warmup-{plan.seed}-{rate!r}-{r.index}") for r in batch))
