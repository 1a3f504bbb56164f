"""`radixmesh bench` end to end on the tiny model: two arms (cost, caching off) at two rates against
real in-process clusters over HTTP, the JSON and PNG it writes, a clean stop that keeps what was
measured, and the command's refusals of bad input."""

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from radixmesh.cluster.api.app import start_http
from radixmesh.cluster.bench import report
from radixmesh.cluster.bench.arms import ARMS, Arm, RunningCluster, Target
from radixmesh.cluster.bench.metrics import Slo
from radixmesh.cluster.bench.runner import BenchPlan, RateLadder, run_bench
from radixmesh.cluster.bench.schedule import schedule
from radixmesh.cluster.bench.workloads import ChatWorkload, LongWorkload
from radixmesh.cluster.cli.main import main
from tests.support.router_cluster import MODEL_NAME, local_cluster

pytestmark = pytest.mark.anyio

# Shared system prompts of 16 blocks (BS = 4), short turns: a shared-prefix workload the tiny model
# serves in milliseconds, with think times short enough that conversations reach their later turns.
CHAT = ChatWorkload(systems=2, system_tokens=64, user_tokens=(4, 8), reply_tokens=(4, 8), turns=(2, 4),
                    think_median_s=0.3, think_bounds_s=(0.1, 1.0), max_tokens=3, max_prompt_tokens=400)
PLAN = BenchPlan(CHAT, (ARMS["cost"], ARMS["off"]), (3.0, 6.0), duration_s=3.0, ramp_s=1.0, drain_s=20.0, warmup=2,
                 slo=Slo(ttft_s=5.0, itl_s=1.0), seed=1)


def measured(rate: float) -> int:
    """Requests of the plan's measured window at `rate` (the ramp's are sent, not counted)."""
    return sum(r.arrival_s >= PLAN.ramp_s for r in schedule(CHAT, rate, PLAN.ramp_s + PLAN.duration_s, PLAN.seed))


class InProcessClusters:
    """A fresh 2-agent in-process cluster per cell, routing with the arm's policy, served over HTTP."""

    def __init__(self) -> None:
        self.arms: list[str] = []

    @contextlib.asynccontextmanager
    async def cluster(self, arm: Arm) -> AsyncIterator[Target]:
        self.arms.append(arm.name)
        async with local_cluster(2, publish=True, policy=arm.policy) as c:
            runner, port = await start_http(c.router, "127.0.0.1", 0)
            try:
                yield Target(f"http://127.0.0.1:{port}", MODEL_NAME)
            finally:
                await runner.cleanup()


class Bars:
    def __init__(self, stop_after: int | None = None, stop: asyncio.Event | None = None) -> None:
        self.totals: dict[str, int] = {}
        self.done_by_arm: dict[str, int] = {}
        self.stop_after, self.stop = stop_after, stop

    def start(self, totals: dict[str, int]) -> None:
        self.totals = totals

    def cell(self, arm: str, rate: float, requests: int) -> None:
        pass

    def done(self, arm: str) -> None:
        self.done_by_arm[arm] = self.done_by_arm.get(arm, 0) + 1
        if self.stop is not None and sum(self.done_by_arm.values()) == self.stop_after:
            self.stop.set()

    def more(self, requests: int) -> None:
        self.totals = {arm: n + requests for arm, n in self.totals.items()}


@pytest.mark.slow
async def test_two_arms_at_two_rates_end_to_end(tmp_path: Path) -> None:
    clusters, bars, saved = InProcessClusters(), Bars(), []
    cells = await run_bench(PLAN, clusters, asyncio.Event(), bars, lambda cs: saved.append(len(cs)))
    assert saved == [1, 2, 3, 4]
    # interleaved: the second rate starts with the second arm
    assert clusters.arms == ["cost", "off", "off", "cost"]
    assert [(c["rate_rps"], c["arm"]) for c in cells] == [(3.0, "cost"), (3.0, "off"), (6.0, "off"), (6.0, "cost")]
    for c in cells:
        offered = measured(c["rate_rps"])
        counts = c["requests"]
        assert counts["offered"] == offered > 0 and c["ramp_requests"] > 0
        assert counts["ok"] + counts["refused"] + counts["failed"] + counts["unfinished"] == offered
        assert counts["ok"] == offered  # a light load: all served
        # the router's counters of the window: its requests, and perhaps a ramp request that ended late
        assert offered <= c["router_requests"] <= offered + c["ramp_requests"]
        assert c["ttft_s"]["p50"] <= c["ttft_s"]["p90"] <= c["ttft_s"]["p99"] < PLAN.drain_s
        assert 0 < c["itl_s"]["p50"] <= c["itl_s"]["p99"]
        assert c["output_tokens_per_s"] == pytest.approx(offered * CHAT.max_tokens / PLAN.duration_s)
        assert c["ttft_lower_bounds"] == 0
        assert not c["interrupted"] and c["sessions"] < offered  # conversations had several turns
        # each decision of the window beside its outcome: the same requests as the router's counters
        d = c["decisions"]
        assert d["decisions"] == c["router_requests"] and d["prefill_tokens"]["realized"] == c["prompt_tokens_computed"]
        # (the test router's clock is manual, so its own TTFTs are 0: the agents' clocks measure the wait)
        assert d["calibration"]["ttft"]["n"] == d["calibration"]["wait"]["n"] == d["decisions"]
        assert d["calibration"]["wait"]["p50"] > 0
        if c["arm"] == "off":
            assert c["hit_rate"] == 0 and c["prompt_tokens_computed"] == c["prompt_tokens"] > 0
            assert c["cached_tokens_reported"] == 0
        else:  # the shared system prompts and each conversation's history are reused
            assert c["hit_rate"] > 0.3 and c["cached_tokens_reported"] > 0
            assert c["hit_rate_by_source"]["local_gpu"] > 0
    sent = {arm: sum(c["requests"]["offered"] + c["ramp_requests"] for c in cells if c["arm"] == arm)
            for arm in ("cost", "off")}
    assert bars.done_by_arm == bars.totals == sent

    doc = report.document({"workload": {"name": "chat"}, "cluster": "2 in-process agents",
                           "slo": {"ttft_s": 5.0, "itl_s": 1.0}}, cells, workload="chat", attainment=0.9,
                          interrupted=False, complete=True)
    json_path, png_path = report.write(doc, tmp_path)
    written = json.loads(json_path.read_text())
    head = written["headline"]
    assert head["workload"] == "chat" and head["knee"]["rate_rps"] in (3.0, 6.0)
    assert head["ttft_p99_cost_over_off"] is not None and head["goodput_cost_over_round_robin"] is None
    assert {"goodput_over_off", "ttft_p99_over_off"} <= set(written["cells"][0]["ratios"])
    assert png_path is not None and png_path.read_bytes().startswith(b"\x89PNG")


@pytest.mark.slow
async def test_long_requests_generate_each_its_own_output_length() -> None:
    # The long workload shrunk for the tiny model: every request's max_tokens reaches the agent (ignore_eos).
    long = LongWorkload(instruction_tokens=16, prompt_tokens=(48, 96), output_tokens=(2, 12), max_tokens=12)
    plan = BenchPlan(long, (ARMS["cost"],), (4.0,), duration_s=2.0, ramp_s=0.5, drain_s=20.0, warmup=0,
                     slo=Slo(ttft_s=5.0, itl_s=1.0), seed=2)
    [cell] = await run_bench(plan, InProcessClusters(), asyncio.Event(), Bars(), lambda cs: None)
    window = [r for r in schedule(long, 4.0, plan.ramp_s + plan.duration_s, plan.seed) if r.arrival_s >= plan.ramp_s]
    assert len({r.max_tokens for r in window}) > 1 and cell["requests"]["ok"] == len(window)
    assert cell["output_tokens_per_s"] == pytest.approx(sum(r.max_tokens for r in window) / plan.duration_s)


def _cell(arm: str, rate: float, attainment: float) -> dict[str, Any]:
    return {"arm": arm, "rate_rps": rate, "slo_attainment": attainment}


@pytest.mark.parametrize(("cells", "done"), [
    # cost still meets the SLO at the top rate: go on
    ([_cell("cost", 1, 1.0), _cell("off", 1, 0.0)], False),
    # cost fell at 2 but that is one rate past its knee (1): go on
    ([_cell("cost", 1, 1.0), _cell("cost", 2, 0.5)], False),
    # two rates past cost's knee, and no caching arm meets the SLO at the top: done ("off" is not a cache arm)
    ([_cell("cost", 1, 1.0), _cell("cost", 2, 0.5), _cell("cost", 3, 0.1), _cell("off", 3, 0.95)], True),
    # two past cost's knee, but prefix_affinity still meets it at the top rate: go on
    ([_cell("cost", 1, 1.0), _cell("cost", 2, 0.5), _cell("cost", 3, 0.1), _cell("prefix_affinity", 3, 0.9)], False),
    # cost never met it: two rates run are past its (unmet) knee
    ([_cell("cost", 1, 0.2), _cell("cost", 2, 0.1)], True),
    # the bound: four rates run
    ([_cell("cost", r, 1.0) for r in (1, 2, 3, 4)], True),
])
def test_the_rate_ladder_stops_once_every_cache_arm_is_past_the_knee(cells: list[dict[str, Any]], done: bool) -> None:
    plan = replace(PLAN, arms=(ARMS["cost"], ARMS["prefix_affinity"], ARMS["off"]), knee_attainment=0.9)
    assert RateLadder(factor=2.0, past_knee=2, max_rates=4).done(plan, cells) is done


@pytest.mark.slow
async def test_a_knee_search_adds_rates_until_the_ladder_is_done() -> None:
    bars = Bars()
    plan = replace(PLAN, arms=(ARMS["cost"],), rates=(3.0,), ladder=RateLadder(factor=1.5, past_knee=1, max_rates=2))
    cells = await run_bench(plan, InProcessClusters(), asyncio.Event(), bars, lambda _: None)
    # a light load: cost meets the SLO at 3/s, so the ladder adds 4.5/s, and then its bound stops it
    assert [c["rate_rps"] for c in cells] == [3.0, 4.5] and cells[0]["slo_attainment"] >= 0.9
    assert bars.totals["cost"] == bars.done_by_arm["cost"] == sum(c["requests"]["offered"] + c["ramp_requests"]
                                                                  for c in cells)


async def test_a_stop_ends_the_running_cell_and_keeps_what_was_measured() -> None:
    stop = asyncio.Event()
    bars = Bars(stop_after=3, stop=stop)
    plan = replace(PLAN, ramp_s=0.0)  # the first requests done are measured ones
    cells = await run_bench(plan, InProcessClusters(), stop, bars, lambda _: None)
    assert len(cells) == 1
    c: dict[str, Any] = cells[0]
    counts = c["requests"]
    assert c["interrupted"] and c["window_s"] < PLAN.duration_s
    assert counts["ok"] >= 3
    assert counts["ok"] + counts["refused"] + counts["failed"] + counts["unfinished"] == counts["offered"]
    assert counts["offered"] < len(schedule(CHAT, 3.0, plan.duration_s, plan.seed))


@pytest.mark.parametrize("args, message", [
    (["bench", "--local", "2", "--url", "http://127.0.0.1:9"], "exactly one of --local N and --url URL"),
    (["bench", "--url", "http://127.0.0.1:9", "--arms", "cost,fastest"], "unknown arm(s) fastest"),
    (["bench", "--url", "http://127.0.0.1:9", "--rates", "1,-2"], "rates > 0"),
    (["bench", "--url", "http://127.0.0.1:9", "--workload", "trace"], "--trace FILE goes with --workload trace"),
    # A system prompt scaled past the context: no first turn could ever be sent (it used to hang).
    (["bench", "--url", "http://127.0.0.1:9", "--workload", "chat", "--prompt-scale", "8"], "max_prompt_tokens"),
])
def test_bad_input_is_one_line_and_nonzero(args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, args)
    assert result.exit_code != 0 and message in result.output


async def test_a_running_deployment_serves_the_arm_of_its_own_policy_and_off() -> None:
    async with local_cluster(1, policy="round_robin") as c:
        runner, port = await start_http(c.router, "127.0.0.1", 0)
        try:
            running = RunningCluster(f"http://127.0.0.1:{port}/")
            for arm in ("round_robin", "off"):
                async with running.cluster(ARMS[arm]) as target:
                    assert target == Target(f"http://127.0.0.1:{port}", MODEL_NAME)
            with pytest.raises(ValueError, match="routes with 'round_robin', not 'cost'"):
                async with running.cluster(ARMS["cost"]):
                    pass
        finally:
            await runner.cleanup()
