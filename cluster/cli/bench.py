"""`radixmesh bench`: the arms (routing policies, caching off) on live clusters under one open-loop
workload at several offered rates; goodput, latency and hit rates per arm and rate, as JSON and PNG.

    radixmesh bench --local 2 --model smollm2-135m-instruct --workload chat,convo,docs --rates 0.5
    radixmesh bench --url http://127.0.0.1:8000 --arms cost,off --workload docs --rates 0.5,1,2 --fixed-rates

By default the bench finds the knee: after the given rates it keeps multiplying the rate by
--rate-factor until every caching arm falls below --knee-attainment, at least --past-knee rates past
cost's knee (at most --max-rates rates). Several workloads run one after another, each into its own
folder under --out (OUT/WORKLOAD/bench.json and .png), with OUT/summary.json holding each headline.

Ctrl-C ends the running cell at once, stops its cluster and writes what was measured; the JSON is
also rewritten after every cell.
"""

import asyncio
import datetime
import json
import os
import platform
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import click
import ray
from rich.console import Console
from rich.progress import Progress

from radixmesh.cluster.bench import report
from radixmesh.cluster.bench.arms import (
    DEFAULT_ARMS,
    VALID_ARMS,
    Arm,
    Clusters,
    LocalClusters,
    RunningCluster,
    arm_named,
    is_arm,
)
from radixmesh.cluster.bench.engine_sim import SIMULATED_NOTE, simulated_cell
from radixmesh.cluster.bench.metrics import Slo
from radixmesh.cluster.bench.runner import BenchPlan, RateLadder, SimulatedCell, run_bench
from radixmesh.cluster.bench.schedule import Workload
from radixmesh.cluster.bench.workloads import GENERATORS, TraceWorkload, workload_settings
from radixmesh.cluster.cli.bench_view import ArmBars, results_table, times
from radixmesh.cluster.cli.options import (
    cache_options,
    chosen_engine,
    chosen_gpu_blocks,
    chosen_log_level,
    engine_options,
    given,
)
from radixmesh.cluster.cli.route_stats import client_access
from radixmesh.cluster.launch import launcher
from radixmesh.cluster.launch.config import LauncherConfig
from radixmesh.cluster.sim.router_client import ClientAccess
from radixmesh.node_agent import SMOLLM2


def _floats(_: click.Context, __: click.Parameter, value: str) -> tuple[float, ...]:
    try:
        rates = tuple(sorted({float(v) for v in value.split(",") if v.strip()}))
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of numbers") from None
    if not rates or min(rates) <= 0:
        raise click.BadParameter("give one or more rates > 0")
    return rates


def _workloads(_: click.Context, __: click.Parameter, value: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(v.strip() for v in value.split(",") if v.strip()))
    valid = [*GENERATORS, "trace"]
    unknown = [n for n in names if n not in valid]
    if unknown or not names:
        raise click.BadParameter(f"unknown workload(s) {', '.join(unknown) or '(none given)'}; valid: {', '.join(valid)}")
    return names


def _arms(_: click.Context, __: click.Parameter, value: str) -> tuple[Arm, ...]:
    names = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [n for n in names if not is_arm(n)]
    if unknown or not names:
        raise click.BadParameter(f"unknown arm(s) {', '.join(unknown) or '(none given)'}; valid: {VALID_ARMS}")
    try:
        arms = [arm_named(n) for n in names]
    except ValueError as e:  # a split_<P>p whose P is no number of agents
        raise click.BadParameter(str(e)) from None
    return tuple({arm.name: arm for arm in arms}.values())


@click.command("bench")
@click.option("--local", "local_nodes", type=click.IntRange(1, 64), default=None,
              help="Start a fresh local cluster of N agents for every arm and rate (else use --url).")
@click.option("--url", default=None, help="Router of a running deployment: its own policy's arm and `off` only.")
@click.option("--workload", "workloads", default="chat", show_default=True, callback=_workloads,
              help=f"Comma-separated workloads, run one after another: {', '.join([*GENERATORS, 'trace'])}.")
@click.option("--trace", "trace_path", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Mooncake JSONL file for --workload trace (e.g. tests/data/traces/mooncake_trace_1000.jsonl).")
@click.option("--arms", "arms", default=",".join(DEFAULT_ARMS), show_default=True, callback=_arms,
              help="Comma-separated arms: routing policies with caching on, `off`, and (--local only) "
                   "split_<P>p (P prefill agents, the rest decode; 1 <= P <= N-1) and split_half, the cost "
                   "policy over prefill and decode agents, the hand-off streamed during the prefill (a split "
                   "arm + _after, e.g. split_half_after: the hand-off after the prefill).")
@click.option("--rates", default="0.5,1,2", show_default=True, callback=_floats,
              help="Comma-separated offered request rates (Poisson arrivals, per second).")
@click.option("--duration", type=click.FloatRange(min=0, min_open=True), default=90.0, show_default=True,
              help="Measured arrival window of each arm and rate, seconds.")
@click.option("--ramp", type=click.FloatRange(min=0), default=30.0, show_default=True,
              help="Seconds the workload runs unmeasured before each window (caches warm, sessions past "
                   "their first turns).")
@click.option("--drain", type=click.FloatRange(min=0), default=30.0, show_default=True,
              help="Seconds after the window a cell waits for requests still running (then: unfinished).")
@click.option("--warmup", type=click.IntRange(min=0), default=4, show_default=True,
              help="Warm-up requests per cell, sharing nothing with the workload.")
@click.option("--ttft-slo", type=click.FloatRange(min=0, min_open=True), default=2.0, show_default=True,
              help="Seconds to the first token a request may take and count toward goodput.")
@click.option("--itl-slo", type=click.FloatRange(min=0, min_open=True), default=0.5, show_default=True,
              help="Mean seconds per output token after the first a request may take and count toward goodput.")
@click.option("--knee-attainment", type=click.FloatRange(0, 1), default=0.9, show_default=True,
              help="The knee: the highest rate at which cost meets the SLO for this share of requests.")
@click.option("--find-knee/--fixed-rates", default=True, show_default=True,
              help="Raise the rate past the given ones until every caching arm is past its knee.")
@click.option("--rate-factor", type=click.FloatRange(min=1, min_open=True), default=1.5, show_default=True,
              help="Each rate the knee search adds is the last one times this.")
@click.option("--past-knee", type=click.IntRange(min=1), default=2, show_default=True,
              help="Rates the knee search runs past the last one at which cost met the SLO.")
@click.option("--max-rates", type=click.IntRange(min=1), default=10, show_default=True,
              help="The knee search's bound: rates in all, the given ones included.")
@click.option("--max-tokens", type=click.IntRange(min=1), default=None,
              help="Output tokens per request (ignore_eos: every arm generates exactly these); for long and "
                   "trace, at most these [default: 8; long draws 64-256].")
@click.option("--prompt-scale", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True,
              help="Multiply the generators' prompt lengths (system prompts, documents, turns).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--seeds", type=click.IntRange(min=1), default=1, show_default=True,
              help="Cells per arm and rate, at seeds SEED .. SEED + N - 1 (each its own requests); the table, "
                   "picture, knee and headline read their means, and the JSON keeps every seed's cells. A knee "
                   "read at one seed moved the cost/affinity ratio by up to 0.3 from seed to seed.")
@click.option("--model", "model_spec", default=SMOLLM2, show_default=True,
              help=f"{SMOLLM2}, random-tiny (seeded random weights), a local Hugging Face directory or a .gguf "
                   "file (--local).")
@click.option("--gpu-blocks", default=None, type=click.IntRange(min=1),
              help="KV blocks of each agent (--local): the same memory for every arm [default: 1024; with "
                   "--engine modeled, the profile's device].")
@click.option("--block-size", type=click.IntRange(min=1), default=16, show_default=True,
              help="Tokens per KV block (--local sets it; with --url, the deployment's).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Folder of bench.json and bench.png [default: a new bench/results/run-YYYYmmdd-HHMMSS under "
                   "the current folder, so a run never overwrites an earlier one].")
@click.option("--simulate", is_flag=True,
              help="With --local N and --engine modeled[:PROFILE]: replay each cell in the engine simulator "
                   "(the agents' engines and the router's routing, admission and calibration on a virtual clock; no "
                   "Ray, no network, the host's cores out of the figures) instead of on a live cluster; minutes "
                   "of cells in seconds, at any number of agents. Labelled SIMULATED.")
@cache_options
@engine_options
def bench(local_nodes: int | None, url: str | None, workloads: tuple[str, ...], trace_path: Path | None,
          arms: tuple[Arm, ...], rates: tuple[float, ...], duration: float, ramp: float, drain: float, warmup: int,
          ttft_slo: float, itl_slo: float, knee_attainment: float, find_knee: bool, rate_factor: float,
          past_knee: int, max_rates: int, max_tokens: int | None, prompt_scale: float, seed: int, seeds: int,
          model_spec: str,
          gpu_blocks: int | None, block_size: int, out_dir: Path | None, simulate: bool, eviction: str, handoff: bool,
          engine: str, speedup: float) -> None:
    """Compare the arms on live clusters: goodput and latency against offered load."""
    if (local_nodes is None) == (url is None):
        raise click.UsageError("give exactly one of --local N and --url URL")
    if url is not None and given("eviction", "handoff", "engine"):
        raise click.UsageError("--eviction, --handoff and --engine set up the agents of --local")
    if url is not None and given("model_spec"):
        raise click.UsageError("--model names the agents' model of --local; against --url, the router says which "
                               "model it serves (its /v1/models)")
    if simulate and (local_nodes is None or not engine.startswith("modeled")):
        raise click.UsageError("--simulate replays a modeled cluster: give --local N and --engine modeled[:PROFILE]")
    if ("trace" in workloads) != (trace_path is not None):
        raise click.UsageError("--trace FILE goes with --workload trace, and only with it")
    try:
        loads = chosen_workloads(workloads, trace_path, block_size, max_tokens, prompt_scale)
    except ValueError as e:  # e.g. a scale whose first turn can never fit the context
        raise click.UsageError(str(e)) from None
    ladder = RateLadder(rate_factor, past_knee, max(max_rates, len(rates))) if find_knee else None
    plans = [BenchPlan(load, arms, rates, duration, ramp, drain, warmup, Slo(ttft_slo, itl_slo), seed, ladder,
                       knee_attainment, seeds) for load in loads]
    clusters: Clusters
    if local_nodes is not None:
        modeled, model = chosen_engine(engine, speedup, model_spec)
        gpu_blocks = chosen_gpu_blocks(gpu_blocks, modeled, block_size)
        try:
            base = LauncherConfig(local_nodes=local_nodes, model=model, modeled=modeled, gpu_blocks=gpu_blocks,
                                  block_size=block_size, log_level=chosen_log_level(), log_access=False,
                                  eviction=eviction, handoff=handoff)
            for arm in arms:  # a split of too few agents is refused now, not after the first arms ran
                arm.prefill_nodes(local_nodes)
        except ValueError as e:
            raise click.UsageError(str(e)) from None
        clusters = LocalClusters(base)
        engine_label = base.engine_label
        where = (f"{local_nodes} {'simulated' if simulate else 'local'} agent(s), {base.served_model_name}, "
                 f"{gpu_blocks} KV blocks each, {engine_label} engine"
                 + (f" at {speedup:g}x" if modeled is not None and speedup != 1 else "")
                 + (" (SIMULATED: engine simulator, virtual time)" if simulate else ""))
    else:
        if any(arm.split for arm in arms):
            raise click.UsageError("split arms (split_<P>p, split_half) split the agents of --local N, not of a "
                                   "running deployment")
        access = client_access()
        clusters = RunningCluster(url or "", access)
        engine_label = asyncio.run(deployment_engine(url or "", access))
        where = f"the deployment at {url}, {engine_label} engine"
    base_settings = {
        "command": " ".join(["radixmesh", *sys.argv[1:]]),
        "started_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "revision": _revision(),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                    "load_average_1m_at_start": os.getloadavg()[0]},
        "cluster": where, "block_size": block_size,
        "engine": {"label": engine_label, "speedup": speedup if local_nodes is not None and engine != "real" else None,
                   "simulated": simulate,
                   "note": ("MODELED: times from the profile's time model (node_agent/model/modeled), not measured "
                            "on its hardware" if "modeled" in engine_label else None)
                   if not simulate else SIMULATED_NOTE},
        "arms": {a.name: {"policy": a.policy, "caching": a.caching} for a in arms},
        "rates_rps": list(rates), "duration_s": duration, "ramp_s": ramp, "drain_s": drain, "warmup": warmup,
        "seed": seed, "seeds": seeds,
        "knee_search": ({"rate_factor": rate_factor, "past_knee": past_knee, "max_rates": ladder.max_rates}
                        if ladder is not None else None),
        "slo": {"ttft_s": ttft_slo, "itl_s": itl_slo,
                "definition": "met: completed, TTFT <= ttft_s and (end to end - TTFT) / (output tokens - 1) "
                              "<= itl_s; goodput = met / arrival window; attainment = met / offered; "
                              "TTFT percentiles include requests unfinished at the cell's end (still waiting "
                              "for a first token: their wait, a lower bound, counted in ttft_lower_bounds); "
                              "ttft_later_turns_s: the same over each session's second and later turns"},
        "knee_attainment": knee_attainment,
    }
    console = Console(width=None if sys.stdout.isatty() else 150)  # a log file gets the whole table
    out_dir = out_dir or fresh_out_dir(Path("bench/results"), datetime.datetime.now())
    console.print(f"results go to {out_dir}; {_expected(plans)}")
    if local_nodes is not None and not simulate:
        with console.status(f"starting Ray for {local_nodes} simulated node(s) ..."):
            launcher.init_local_ray(base)
    summary: dict[str, Any] = {}
    try:
        for plan in plans:
            where_to = out_dir / plan.workload.name if len(plans) > 1 else out_dir
            settings = {**base_settings, "workload": workload_settings(plan.workload)}
            simulated = simulated_cell(base, plan) if simulate else None
            interrupted = _one_workload(plan, clusters, console, settings, where_to, knee_attainment, simulated)
            summary[plan.workload.name] = json.loads((where_to / "bench.json").read_text())["headline"]
            if interrupted:
                break
    finally:
        if local_nodes is not None and not simulate:
            ray.shutdown()
    if len(plans) > 1:
        (out_dir / "summary.json").write_text(json.dumps({"settings": base_settings, "headlines": summary},
                                                         indent=2) + "\n")
        console.print(f"wrote {out_dir / 'summary.json'}: each workload's headline")


def chosen_workloads(names: tuple[str, ...], trace_path: Path | None, block_size: int, max_tokens: int | None,
                     prompt_scale: float) -> list[Workload]:
    """The workloads named, in order; ValueError for settings a generator refuses. `max_tokens` None
    keeps each workload's own output lengths (long's range among them)."""
    outputs: dict[str, Any] = {} if max_tokens is None else {"max_tokens": max_tokens}
    return [TraceWorkload(trace_path, block_size, **outputs) if name == "trace" and trace_path is not None
            else GENERATORS[name](**outputs, scale=prompt_scale) for name in names]


def _one_workload(plan: BenchPlan, clusters: Clusters, console: Console, settings: dict[str, Any], out_dir: Path,
                  knee_attainment: float, simulate: SimulatedCell | None = None) -> bool:
    """Run and report one workload's bench into `out_dir` (`simulate`: in the engine simulator);
    whether it was interrupted."""
    try:
        cells, interrupted = asyncio.run(_run(plan, clusters, console, settings, out_dir, knee_attainment, simulate))
    except (ValueError, TimeoutError, launcher.DeploymentExists, aiohttp.ClientError, OSError) as e:
        raise click.ClickException(f"bench stopped: {e} (the cells measured before it are in "
                                   f"{out_dir / 'bench.json'})") from None
    except ray.exceptions.RayError as e:  # a part of a local cluster failed to start
        raise click.ClickException(f"a cluster failed to start: {e}") from None
    doc = report.document(settings, cells, workload=plan.workload.name, attainment=knee_attainment,
                          interrupted=interrupted, complete=not interrupted)
    json_path, png_path = report.write(doc, out_dir)
    console.print(results_table(doc))
    head = doc["headline"]
    if head is not None:
        console.print(f"{plan.workload.name}: headline at the knee ({head['knee']['rate_rps']:g}/s, met: "
                      f"{head['knee']['met']}): " + ", ".join(f"{k} {times(head[k])}" for k, _, _ in report.HEADLINE_RATIOS))
    console.print(f"wrote {json_path}" + (f" and {png_path}" if png_path else "")
                  + (" (interrupted: what was measured)" if interrupted else ""))
    return interrupted


def fresh_out_dir(root: Path, now: datetime.datetime) -> Path:
    """`root`/run-YYYYmmdd-HHMMSS (as vLLM's benchmark scripts stamp their result files), a suffix added
    when a run in the same second took that name: the committed figures in bench/results stay as they are."""
    base = root / f"run-{now:%Y%m%d-%H%M%S}"
    out, n = base, 1
    while out.exists():
        n += 1
        out = base.with_name(f"{base.name}-{n}")
    return out


def _expected(plans: list[BenchPlan]) -> str:
    """The arrivals' duration, told before the bench starts: the given rates alone up to every rate the
    knee search may add, each cell draining in full."""
    shortest = sum(p.expected_s().shortest_s for p in plans)
    longest = sum(p.expected_s().longest_s for p in plans)
    span = f"{_minutes(shortest)}" if shortest == longest else f"{_minutes(shortest)} to {_minutes(longest)}"
    return f"expect {span} of arrivals, plus a cluster start and warm-up per cell"


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


async def deployment_engine(url: str, access: ClientAccess) -> str:
    """The engine label(s) the deployment's agents export (radixmesh_agent_engine in the router's merged
    /metrics), comma-separated; "unknown" when it does not say (an older deployment, a refused scrape)."""
    try:
        async with access.session() as http, http.get(f"{url.rstrip('/')}/metrics",
                                                      timeout=aiohttp.ClientTimeout(total=10)) as r:
            text = await r.text() if r.status == 200 else ""
    except (aiohttp.ClientError, TimeoutError):
        text = ""
    labels = sorted(set(re.findall(r'^radixmesh_agent_engine\{[^}]*engine="([^"]+)"', text, re.MULTILINE)))
    return ",".join(labels) or "unknown"


def _revision() -> str | None:
    """The checkout's commit (with "+dirty" for uncommitted changes), to tell before from after; None
    outside a git checkout."""
    here = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True,
                                check=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, check=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("+dirty" if dirty else "")


async def _run(plan: BenchPlan, clusters: Clusters, console: Console, settings: dict[str, Any], out_dir: Path,
               attainment: float, simulate: SimulatedCell | None) -> tuple[list[dict[str, Any]], bool]:
    """run_bench with the bars, the first Ctrl-C as a clean stop (a second one interrupts), and the JSON
    rewritten after every cell."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def interrupt() -> None:
        console.print("stopping: the running cell ends now; Ctrl-C again to abandon it")
        stop.set()
        loop.remove_signal_handler(signal.SIGINT)

    loop.add_signal_handler(signal.SIGINT, interrupt)

    def save(cells: list[dict[str, Any]]) -> None:
        doc = report.document(settings, cells, workload=plan.workload.name, attainment=attainment,
                              interrupted=stop.is_set(), complete=False)
        report.write(doc, out_dir, picture=False)

    try:
        with Progress(console=console) as progress:
            cells = await run_bench(plan, clusters, stop, ArmBars(progress), save, simulate=simulate)
    finally:
        loop.remove_signal_handler(signal.SIGINT)
    return cells, stop.is_set()
