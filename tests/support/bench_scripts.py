"""The scripts under bench/: as modules, for tests that call their functions (bench/ is not a package),
and as commands, for the smoke runs that keep every benchmark from rotting."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

BENCH = Path(__file__).resolve().parents[2] / "bench"
ROOT = BENCH.parent

RAY_SMOKES = frozenset({"chaos", "gpu_cluster", "idle_cpu", "modeled_fidelity", "overload", "ray_tls_cost"})
"""The benchmarks whose smoke run starts a Ray head: tests/ray/test_bench_smoke.py runs them, on the
worker that runs every Ray test one after another; tests/bench/test_bench_smoke.py runs the rest."""

SMOKED_ELSEWHERE = {"gpu_check": "tests/kernels/test_kernels_gpu_check_box.py"}
"""Benchmarks whose smoke run a test of their own makes, and checks further: gpu_check's runs on a box
as bare as a lent GPU's (its kernels and engine steps; a smoke leaves the cluster step to
gpu_cluster's), so running it again in the full environment would take ~13 s for nothing more."""

SMOKE_TIMEOUT_S = 240
"""A smoke run takes seconds on an idle 2-core box; the bound only stops one that hangs."""
SMOKE_TIMEOUT_S_OF = {"modeled_fidelity": 600}
"""Smokes that start two clusters (modeled_fidelity's sides, at once: under a minute on a 2-core box at
load 5, 65-73 s one after the other; the bound is from when they took 4+ min under the suite)."""


def load_bench(name: str) -> ModuleType:
    """bench/<name>.py, imported under the module name `bench_<name>`, its siblings importable as
    `python bench/<name>.py` finds them (bench/ on sys.path, last: it shadows nothing)."""
    if str(BENCH) not in sys.path:
        sys.path.append(str(BENCH))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def bench_scripts() -> list[str]:
    """Every benchmark a user can run: the scripts with a `__main__` block (the others are helpers
    the benchmarks import, such as checked_answers)."""
    return sorted(p.stem for p in BENCH.glob("*.py") if 'if __name__ == "__main__":' in p.read_text())


def run_smoke(name: str, out: Path) -> list[dict[str, Any]]:
    """`python bench/<name>.py --smoke --out OUT` from the repository root, as a user would run it.

    The script must exit 0 and write at least one JSON result under OUT, each marked `"smoke": true`
    (a smoke run's figures are never mistaken for a measurement); those results are returned."""
    out.mkdir(parents=True, exist_ok=True)
    run = subprocess.run(
        [sys.executable, str(BENCH / f"{name}.py"), "--smoke", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=SMOKE_TIMEOUT_S_OF.get(name, SMOKE_TIMEOUT_S), check=False,
    )
    assert run.returncode == 0, f"bench/{name}.py --smoke exited {run.returncode}\n{run.stdout}\n{run.stderr}"
    results = [json.loads(p.read_text()) for p in sorted(out.rglob("*.json"))]
    assert results, f"bench/{name}.py --smoke wrote no JSON under {out}\n{run.stdout}"
    assert all(r.get("smoke") is True for r in results), f"bench/{name}.py --smoke: a result lacks smoke: true"
    return results
