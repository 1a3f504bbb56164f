"""Hit rate with host and disk tiers in the simulator: every trace in tests/data/traces at tight gpu
memory, gpu-only next to a host tier of 4x the gpu's blocks and a host tier of 4x plus a disk tier of
20x, next to the infinite bound (issue 29).

    python bench/sim_tiers.py [--nodes 8] [--workers 2] [--limit K] [--out DIR] [--smoke]

Tight memory is workload_hit_rate's: each node's gpu holds 10% of the workload's unique blocks over 8
(at least the longest prompt). Every other setting is `radixmesh up`'s (SimConfig's defaults); tiers
are the simulator's victim tiers (node.SecondChance) read at SimConfig's host and disk bandwidths,
and the index learns them from tier cache events, so the routers see and price each node's host and
disk prefix.
Prints a table and writes DIR/sim_tiers.json (default bench/results).
"""

import argparse
import json
import multiprocessing
import os
import platform
import time
from pathlib import Path
from typing import NamedTuple

from rich.console import Console
from rich.table import Table
from workload_hit_rate import HELD_OUT, MEMORY, TRACES, TUNING, _requests, capacity

from radixmesh.cluster.sim.config import SimConfig
from radixmesh.cluster.sim.simulator import Simulator

RESULTS = Path(__file__).resolve().parent / "results"


class Tiers(NamedTuple):
    """Host and disk tier sizes as multiples of the gpu's blocks."""

    host: int
    disk: int


ROWS = {"gpu only": Tiers(0, 0), "+host 4x": Tiers(4, 0), "+host 4x +disk 20x": Tiers(4, 20)}
SMOKE = {"workloads": ["chat"], "limit": 200}


def run_cell(job: tuple[str, int | None, str, int, int]) -> dict[str, object]:
    name, limit, row, nodes, cap = job
    tiers = ROWS[row]
    config = SimConfig(nodes=nodes, capacity_blocks=cap, host_blocks=tiers.host * cap, disk_blocks=tiers.disk * cap)
    r = Simulator(config).run(_requests(name, limit))
    return {"hit_rate": r.hit_rate, "infinite_bound": r.infinite_bound, "global_lru": r.global_lru,
            "hits_by_source": r.hits_by_source, "misses_by_cause": r.misses_by_cause, "ttft_p50_s": r.ttft_p50_s, "ttft_p99_s": r.ttft_p99_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2, help="simulations run in parallel processes")
    ap.add_argument("--workloads", nargs="+", default=[*TUNING, *HELD_OUT])
    ap.add_argument("--limit", type=int, default=None, help="first K requests of each workload")
    ap.add_argument("--out", type=Path, default=RESULTS, help="folder for sim_tiers.json")
    ap.add_argument("--smoke", action="store_true", help=f"tiny run: {SMOKE}")
    args = ap.parse_args()
    if args.smoke:  # smaller defaults; sizes given on the command line still win
        ap.set_defaults(**SMOKE)
        args = ap.parse_args()
    t0 = time.perf_counter()
    caps = {name: capacity(_requests(name, args.limit), MEMORY["tight"]) for name in args.workloads}
    jobs = [(name, args.limit, row, args.nodes, caps[name]) for name in args.workloads for row in ROWS]
    with multiprocessing.Pool(args.workers) as pool:
        results = dict(zip(jobs, pool.map(run_cell, jobs, chunksize=1)))

    table = Table(title=f"hit rate at tight gpu memory, {args.nodes} nodes (tiers: x the gpu's blocks)")
    for col in ("workload", "gpu blocks/node", *ROWS, "infinite bound", "host+disk / bound", "TTFT p50 gpu / tiers ms"):
        table.add_column(col, justify="left" if col == "workload" else "right")
    cells = []
    for name in args.workloads:
        cap = caps[name]
        by_row = {row: results[(name, args.limit, row, args.nodes, cap)] for row in ROWS}
        bound = float(by_row["gpu only"]["infinite_bound"])  # type: ignore[arg-type]
        full = by_row["+host 4x +disk 20x"]
        cells.append({"workload": name, "held_out": name in HELD_OUT, "capacity_blocks": cap,
                      "infinite_bound": bound, "rows": by_row})
        table.add_row(name, str(cap), *(f"{float(by_row[row]['hit_rate']):.3f}" for row in ROWS),  # type: ignore[arg-type]
                      f"{bound:.3f}", f"{float(full['hit_rate']) / bound:.3f}" if bound else "-",  # type: ignore[arg-type]
                      f"{float(by_row['gpu only']['ttft_p50_s']) * 1e3:.1f} / "  # type: ignore[arg-type]
                      f"{float(full['ttft_p50_s']) * 1e3:.1f}")  # type: ignore[arg-type]
    Console(width=160).print(table)
    default = SimConfig(nodes=1, capacity_blocks=1)
    doc = {
        "nodes": args.nodes, "memory_fraction": MEMORY["tight"], "rows": {k: v._asdict() for k, v in ROWS.items()},
        "host_bytes_per_s": default.host_bytes_per_s, "disk_bytes_per_s": default.disk_bytes_per_s,
        "traces": str(TRACES.relative_to(TRACES.parents[2])), "cells": cells,
        "machine": platform.platform(), "cpus": os.cpu_count(), "load_avg": os.getloadavg(),
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    if args.limit:
        doc["limit"] = args.limit
    if args.smoke:
        doc["smoke"] = True
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sim_tiers.json").write_text(json.dumps(doc, sort_keys=True, indent=1) + "\n")


if __name__ == "__main__":
    main()
