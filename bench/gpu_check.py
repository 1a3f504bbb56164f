"""GPU check for a lent device, as one command: three steps (kernels: bench/gpu_kernels.py, engine:
bench/gpu_engine.py, cluster: bench/gpu_cluster.py), each in its own process under its own time
budget, into one JSON.

    python bench/gpu_check.py --fetch-wheels build/gpu_wheels        # here, once: the wheels
    python bench/gpu_check.py --wheels build/gpu_wheels --out DIR    # on the GPU box, about 8 minutes
    python bench/gpu_check.py --smoke --out DIR                      # on a CPU: tiny shapes, seconds

Writes DIR/gpu_check.json (default bench/results/). Exits 2 without CUDA (a smoke run needs none), 1
when a check failed or a step crashed, else 0 (timeouts and skips are in the JSON). The steps, their
budgets and what they need: docs/benchmarks.md#benchgpu_checkpy and docs/gpu_check.md.
"""

import argparse
import importlib.metadata
import importlib.util
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gpu_wheels
import torch
from gpu_step import StepLog, StepStatus, read_step

SCRIPT = Path(__file__).resolve()
ROOT = SCRIPT.parents[1]
RESULTS = SCRIPT.parent / "results"


def run_kernels(args: argparse.Namespace, log: StepLog) -> None:
    import gpu_kernels  # each step's module loads in that step's own process only

    plan = gpu_kernels.SMOKE_PLAN if args.smoke else gpu_kernels.GPU_PLAN
    log.finish(**gpu_kernels.run(plan.quick() if args.quick else plan, _device(args), args.seed, log))


def run_engine(args: argparse.Namespace, log: StepLog) -> None:
    try:
        import gpu_engine  # imports the engine, which needs the carried wheels
    except ModuleNotFoundError as exc:
        lacking = [m for m in gpu_wheels.CARRIED if importlib.util.find_spec(m) is None]
        log.skip(f"the engine imports {exc.name!r}, which this box lacks (of the carried modules it lacks "
                 f"{', '.join(lacking) or 'none'}): carry them with --wheels (docs/gpu_check.md)")
        return
    plan = gpu_engine.SMOKE_PLAN if args.smoke else gpu_engine.GPU_PLAN
    summary = gpu_engine.run(plan.quick() if args.quick else plan, _device(args), args.seed, log)
    log.finish(**summary, imported=imported_distributions())  # what a bare box must have or be given


def run_cluster(args: argparse.Namespace, log: StepLog) -> None:
    try:
        import gpu_cluster  # imports ray, which a lent box may lack
    except ImportError as exc:
        log.skip(f"the cluster cannot be imported here ({exc}); it needs ray")
        return
    try:
        gpu_cluster.resolve_model(args.model)
    except ValueError as exc:  # SmolLM2 comes in a wheel of its own, which a lent box may lack too
        log.skip(f"the cluster's model is not here: {exc}")
        return
    trials = "3" if args.quick else "5"
    result = gpu_cluster.run(gpu_cluster.parse_args(["--model", args.model, "--trials", trials]))
    for row in result.pop("rows"):
        log.record("cluster_trial", row["same_tokens"] and not row["pull_failed"], **row)
    log.finish(**result)


@dataclass(frozen=True, slots=True)
class Step:
    name: str
    budget_s: float
    """Default budget: the three add up to 8 minutes on an H200, with room for each step's start."""
    run: Callable[[argparse.Namespace, StepLog], None]
    smoke_skip: str | None = None
    """Why a smoke run skips it (None: it runs, at tiny sizes on the CPU)."""


STEPS = (
    Step("kernels", 180, run_kernels),
    Step("engine", 200, run_engine),
    Step("cluster", 100, run_cluster,
         smoke_skip="a smoke run leaves the cluster to bench/gpu_cluster.py --smoke, which starts a Ray head"),
)
STEP_NAMES = tuple(s.name for s in STEPS)


def _device(args: argparse.Namespace) -> torch.device:
    return torch.device("cpu" if args.smoke else "cuda")


def imported_distributions() -> dict[str, str]:
    """The installed distributions (but radixmesh) whose modules this process has imported, with versions."""
    owners = importlib.metadata.packages_distributions()
    dists = {d for name in {m.partition(".")[0] for m in sys.modules} for d in owners.get(name, [])}
    return {d: importlib.metadata.version(d) for d in sorted(dists - {"radixmesh"})}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="GPU check: kernels, engine, cluster, each under a time budget.")
    p.add_argument("--out", type=Path, default=RESULTS, help="folder for gpu_check.json")
    p.add_argument("--smoke", action="store_true", help="on the CPU: tiny shapes and the tiny model, no cluster")
    p.add_argument("--quick", action="store_true", help="fewer timing cases (checks unchanged)")
    p.add_argument("--steps", default=",".join(STEP_NAMES), help=f"comma-separated, of {', '.join(STEP_NAMES)}")
    p.add_argument("--budget-s", action="append", default=[], metavar="[STEP=]SECONDS",
                   help="a step's time budget (all steps without STEP=); defaults: "
                        + ", ".join(f"{s.name} {s.budget_s:g}" for s in STEPS))
    p.add_argument("--wheels", type=Path, help="folder of the engine's wheels, unpacked onto the steps' path")
    p.add_argument("--fetch-wheels", type=Path, metavar="DIR", help="download those wheels into DIR, and stop")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", default="smollm2-135m-instruct", help="model of the cluster step")
    p.add_argument("--step", choices=STEP_NAMES, help=argparse.SUPPRESS)  # a step's own process
    p.add_argument("--step-out", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.steps = [s for s in args.steps.split(",") if s]
    if unknown := set(args.steps) - set(STEP_NAMES):
        p.error(f"unknown steps {sorted(unknown)}; valid: {', '.join(STEP_NAMES)}")
    if args.wheels is not None and not any(args.wheels.glob("*.whl")):
        p.error(f"--wheels {args.wheels}: no wheels there (fetch them with --fetch-wheels DIR)")
    try:
        args.budgets = parse_budgets(args.budget_s)
    except ValueError as exc:
        p.error(str(exc))
    return args


def parse_budgets(values: list[str]) -> dict[str, float]:
    """`SECONDS` sets every step's budget, `STEP=SECONDS` one step's; later values win."""
    budgets = {s.name: s.budget_s for s in STEPS}
    for value in values:
        name, _, seconds = value.rpartition("=")
        if name and name not in budgets:
            raise ValueError(f"--budget-s {value!r}: unknown step {name!r}; valid: {', '.join(STEP_NAMES)}")
        try:
            budget = float(seconds)
        except ValueError:
            raise ValueError(f"--budget-s {value!r}: {seconds!r} is not a number of seconds") from None
        for step in [name] if name else list(budgets):
            budgets[step] = budget
    return budgets


def step_env(args: argparse.Namespace, scratch: Path) -> tuple[dict[str, str], dict[str, str]]:
    """The steps' environment (this checkout and the unpacked wheels first on PYTHONPATH) and the
    wheels carried, {distribution: version}."""
    paths = [str(ROOT)]
    carried: dict[str, str] = {}
    if args.wheels is not None:
        carried = gpu_wheels.unpack(args.wheels, scratch / "site")
        paths.insert(0, str(scratch / "site"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*paths, *filter(None, [os.environ.get("PYTHONPATH")])])}
    if args.smoke:  # the Triton kernels run as Python on CPU tensors; read as they load, so set here
        env["TRITON_INTERPRET"] = "1"
    return env, carried


def step_command(args: argparse.Namespace, name: str, out: Path) -> list[str]:
    flags = ["--seed", str(args.seed), "--model", args.model]
    flags += [f for f, on in (("--smoke", args.smoke), ("--quick", args.quick)) if on]
    return [sys.executable, str(SCRIPT), "--step", name, "--step-out", str(out), *flags]


def run_step(args: argparse.Namespace, name: str, env: dict[str, str], scratch: Path) -> dict[str, Any]:
    """One step in its own process under its budget; the step's record, with how it ended."""
    budget = args.budgets[name]
    out, log_path = scratch / f"{name}.json", scratch / f"{name}.log"
    start = time.monotonic()
    with log_path.open("w") as log:
        # Its own session, so a kill at the budget also stops what it started (the cluster's Ray head).
        proc = subprocess.Popen(step_command(args, name, out), stdout=log, stderr=subprocess.STDOUT, env=env,
                                cwd=ROOT, start_new_session=True)
        try:
            rc: int | None = proc.wait(timeout=budget)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = None
    wall = time.monotonic() - start
    output = log_path.read_text(errors="replace")
    print(f"--- {name} ({wall:.1f} s of {budget:g})\n{output}", flush=True)
    written = read_step(out) or StepLog(None).as_dict()
    status = conclude(rc, written)
    record = {**written, "status": status, "budget_s": budget, "wall_s": round(wall, 1)}
    if status in ("timeout", "error"):
        record["output_tail"] = output[-3000:]
    return record


def skipped(reason: str) -> dict[str, Any]:
    log = StepLog(None)
    log.skip(reason)
    return {**log.as_dict(), "budget_s": None, "wall_s": 0.0}


def conclude(rc: int | None, written: dict[str, object]) -> StepStatus:
    """How a step ended, from its exit code (None: killed at its budget) and what it wrote."""
    if rc is None:
        return "timeout"
    if rc != 0 or written["status"] not in ("ok", "skipped"):
        return "error"
    if written["status"] == "ok" and not written["correct"]:
        return "failed"
    return "skipped" if written["status"] == "skipped" else "ok"


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def check(args: argparse.Namespace) -> dict[str, Any]:
    """Every selected step, one after another; the JSON result."""
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpu_check-") as tmp:
        scratch = Path(tmp)
        env, carried = step_env(args, scratch)
        steps = {s.name: skipped(s.smoke_skip) if args.smoke and s.smoke_skip
                 else run_step(args, s.name, env, scratch) for s in STEPS if s.name in args.steps}
    devices = [s["summary"]["device"] for s in steps.values() if "device" in s["summary"]]
    return {
        "bench": "gpu_check", "smoke": args.smoke, "quick": args.quick, "device": devices[0] if devices else None,
        "environment": {"python": platform.python_version(), "torch": _version("torch"),
                        "triton": _version("triton"), "numpy": _version("numpy"), "carried": carried},
        "budgets_s": {name: args.budgets[name] for name in args.steps},
        "correct": all(s["correct"] for s in steps.values()),
        "complete": all(s["status"] in ("ok", "failed") for s in steps.values()),
        "wall_s": round(time.monotonic() - start, 1),
        "steps": steps,
    }


def fetch(dest: Path) -> int:
    dest.mkdir(parents=True, exist_ok=True)
    rc = subprocess.run(gpu_wheels.fetch_command(dest), check=False).returncode
    wheels = sorted(dest.glob("*.whl"))
    for w in wheels:
        print(f"{w.stat().st_size / 1e6:8.2f} MB  {w.name}")
    print(f"{sum(w.stat().st_size for w in wheels) / 1e6:8.2f} MB  in {dest}")
    return rc


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.fetch_wheels is not None:
        return fetch(args.fetch_wheels)
    if args.step is not None:
        assert args.step_out is not None, "a step's process is told where to write"
        if args.smoke:
            torch.set_num_threads(1)  # a smoke run shares a small box: more intra-op threads only contend
        next(s for s in STEPS if s.name == args.step).run(args, StepLog(args.step_out))
        return 0
    if not args.smoke and not torch.cuda.is_available():
        print("gpu_check needs a CUDA device (torch.cuda.is_available() is False); nothing measured. "
              "On a CPU, --smoke runs the kernels and the engine at tiny sizes.", file=sys.stderr)
        return 2
    result = check(args)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "gpu_check.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    for name, s in result["steps"].items():
        print(f"{name:8} {s['status']:8} {s['wall_s']:7.1f} s  correct={s['correct']}  {s.get('reason') or ''}")
    print(f"correct={result['correct']} complete={result['complete']} wall={result['wall_s']} s -> {path}")
    failed = not result["correct"] or any(s["status"] == "error" for s in result["steps"].values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
