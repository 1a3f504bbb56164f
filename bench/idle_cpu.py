"""Idle CPU: what each process of a local cluster costs while nobody sends a request (issue 36's goal:
an agent under 2% of a core).

    python bench/idle_cpu.py [--nodes 2] [--model random-tiny] [--engine modeled:h100-llama3-8b]
                             [--settle 15] [--window 20] [--out bench/results] [--smoke]

Starts `radixmesh up --local N` as a user would (its own RADIXMESH_HOME, router port 0), waits until
it serves, lets it settle, then reads every process's CPU time (user + system, psutil) over the
window: the agents, the metadata service, the router, `up` itself and Ray's own processes. The
baseline is Ray's: an idle Ray worker costs about as much as the floor under every actor.

Writes OUT/idle_cpu.json (idle_cpu_<engine>.json with --engine). --smoke: 1 node, a 1 s window,
marked "smoke": true. The runs in full: docs/benchmarks.md#benchidle_cpupy.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

import psutil

RESULTS = Path(__file__).parent / "results"
UP_TIMEOUT_S = 240.0
"""`up` serves within a minute on an idle 2-core box; the bound only stops one that hangs."""
ROLES = {"ray::AgentActor": "agent", "ray::MetadataActor": "metadata", "ray::RouterActor": "router",
         "ray::IDLE": "ray idle worker"}
"""Process titles (Ray names a worker after its actor, `.method` appended while a call runs)."""
GOAL_PCT = 2.0
"""Issue 36: an idle agent costs less than this share of one core."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="CPU share of each process of an idle local cluster.")
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--model", default="random-tiny", help="with the real engine (a profile names its own)")
    p.add_argument("--engine", default="real", help="real, or modeled:PROFILE (as `up --engine`)")
    p.add_argument("--settle", type=float, default=15.0, help="seconds between serving and the window")
    p.add_argument("--window", type=float, default=20.0, help="seconds of CPU time read")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--smoke", action="store_true", help="a tiny run, so the bench cannot rot (not a measurement)")
    args = p.parse_args(argv)
    if args.smoke:
        args.nodes, args.settle, args.window = 1, 0.0, 1.0
    return args


def role(proc: psutil.Process, up_pid: int) -> str:
    """What `proc` is in the deployment: an actor's role, `up`, or Ray's own process by its name."""
    if proc.pid == up_pid:
        return "up"
    try:
        title = " ".join(proc.cmdline()) or proc.name()
    except psutil.Error:
        return "gone"
    for prefix, name in ROLES.items():
        if title.startswith(prefix):
            return name
    words = title.split() or ["?"]
    name = Path(words[0]).name
    if name.startswith("python"):  # a Python process: its script
        name = next((Path(w).name for w in words[1:] if w.endswith(".py")), name)
    return f"ray {name}"


def cpu_seconds(procs: Iterable[psutil.Process]) -> dict[int, float]:
    """User + system CPU seconds of each process still alive."""
    out = {}
    for proc in procs:
        try:
            times = proc.cpu_times()
            out[proc.pid] = times.user + times.system
        except psutil.Error:
            pass
    return out


def measure(up: psutil.Process, window_s: float) -> list[dict[str, Any]]:
    """Each process of `up`'s tree: its role and CPU share (percent of one core) over `window_s`."""
    procs = [up, *up.children(recursive=True)]
    roles = {p.pid: role(p, up.pid) for p in procs}
    before, t0 = cpu_seconds(procs), time.monotonic()
    time.sleep(window_s)  # the measured window: nothing here waits for a result
    after, elapsed = cpu_seconds(procs), time.monotonic() - t0
    rows = [{"pid": pid, "role": roles[pid], "cpu_pct": round(100 * (after[pid] - before[pid]) / elapsed, 3)}
            for pid in before if pid in after]
    return sorted(rows, key=lambda r: (r["role"], -r["cpu_pct"]))


def copy_output(up: subprocess.Popen[str], log: IO[str]) -> tuple[threading.Thread, threading.Event]:
    """Copy `up`'s output to `log` on a thread until `up` exits; the event is set once it serves."""
    serving = threading.Event()

    def copy() -> None:
        assert up.stdout is not None
        for line in up.stdout:
            log.write(line)
            if line.startswith("serving;"):
                serving.set()

    thread = threading.Thread(target=copy, daemon=True)
    thread.start()
    return thread, serving


def wait_serving(up: subprocess.Popen[str], serving: threading.Event, log: IO[str]) -> None:
    deadline = time.monotonic() + UP_TIMEOUT_S
    while not serving.wait(0.5):
        if up.poll() is not None or time.monotonic() > deadline:
            log.flush()
            tail = Path(log.name).read_text()[-2000:]
            raise RuntimeError(f"`up` never served (exit {up.returncode}); the end of its output:\n{tail}")


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per role: how many processes, the largest and the mean share; and the whole tree's."""
    by_role: dict[str, list[float]] = {}
    for r in rows:
        by_role.setdefault(r["role"], []).append(r["cpu_pct"])
    return {name: {"processes": len(v), "max_pct": max(v), "mean_pct": round(sum(v) / len(v), 3)}
            for name, v in sorted(by_role.items())} | {"total_pct": round(sum(r["cpu_pct"] for r in rows), 3)}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    engine = ["--model", args.model] if args.engine == "real" else ["--engine", args.engine]
    command = [sys.executable, "-m", "radixmesh.cluster.cli", "up", "--local", str(args.nodes), *engine, "--port", "0"]
    with tempfile.TemporaryDirectory(prefix="radixmesh-idle-") as home:
        # cwd: the home, so that PYTHONPATH (a worktree of another revision) decides which radixmesh runs
        up = subprocess.Popen(command, cwd=home, env={**os.environ, "RADIXMESH_HOME": home},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        with open(Path(home) / "up.log", "w") as log:
            copier, serving = copy_output(up, log)
            try:
                wait_serving(up, serving, log)
                time.sleep(args.settle)  # start-up's own work (imports, first rounds) ends
                rows = measure(psutil.Process(up.pid), args.window)
            finally:
                up.send_signal(signal.SIGINT)  # as Ctrl-C: `up` takes its cluster down
                try:
                    up.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    up.kill()
                    up.wait()
                copier.join()
    agents = summary(rows).get("agent", {})
    result = {
        "bench": "idle_cpu", "nodes": args.nodes, "model": args.model if args.engine == "real" else None,
        "engine": args.engine,
        "settle_s": args.settle, "window_s": args.window, "command": " ".join(command[2:]),
        "pythonpath": os.environ.get("PYTHONPATH", ""),  # a worktree: the revision measured
        "machine": {"cpus": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2)},
        "goal_agent_pct": GOAL_PCT, "agent_max_pct": agents.get("max_pct"),
        "agents_within_goal": agents.get("max_pct", float("inf")) < GOAL_PCT,
        "by_role": summary(rows), "processes": rows, "smoke": args.smoke,
    }
    name = "idle_cpu" if args.engine == "real" else f"idle_cpu_{args.engine.replace(':', '_')}"
    (args.out / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    for r in rows:
        print(f"{r['cpu_pct']:7.2f}%  {r['role']:<24} pid {r['pid']}")
    print(json.dumps({k: result[k] for k in ("command", "agent_max_pct", "agents_within_goal")}
                     | {"total_pct": result["by_role"]["total_pct"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
