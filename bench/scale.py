"""How routing overhead and index memory grow with the cluster (8 -> 512 nodes) and the trace.

    python bench/scale.py [--limit K] [--route-decisions N] [--lag-events N] [--out DIR] [--smoke]

Per size: index match latency, routing-decision time and index memory per entry, against the 8-node
figures; then the production Router's decision on its index replica vs the Match RPC vs a dict
lookup (bench/route_paths.py), and replica lag. What each figure measures:
docs/benchmarks.md#benchscalepy.

Writes DIR/scale.json and DIR/scale.png (default bench/results); the last line printed is the JSON.
--smoke: the trace's first SMOKE_REQUESTS requests, fewer nodes and decisions, marked "smoke": true.
"""

import argparse
import asyncio
import json
import time
import tracemalloc
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from route_paths import bench_lag, bench_routes

from radixmesh.cluster.metadata.index import GlobalIndex
from radixmesh.cluster.sim.config import SimConfig
from radixmesh.cluster.sim.simulator import SimRequest, Simulator, prepare
from radixmesh.cluster.sim.trace import read_trace
from radixmesh.proto.events import Tier

TRACE = Path(__file__).resolve().parents[1] / "tests" / "data" / "traces" / "synthetic_trace.jsonl"
RESULTS = Path(__file__).resolve().parent / "results"
ROUTE_NODES, SWEEP_NODES = (8, 64, 512), (8, 32, 128, 512)
SMOKE = {"route_warm": 100, "route_decisions": 50, "lag_events": 50}
SMOKE_REQUESTS, SMOKE_ROUTE_NODES, SMOKE_SWEEP_NODES = 200, (8, 64), (8, 512)  # route_us_512_over_8 stays true


def index_bytes_per_entry(sim: Simulator) -> tuple[int, float]:
    """(holder entries, bytes per entry) of an index rebuilt from every node's cache snapshot."""
    index = GlobalIndex()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    entries = 0
    for nid, node in sim.nodes.items():
        index.add_node(nid, "sim")
        for h, parent in node.cache.snapshot():
            index.insert(nid, [h], parent, Tier.GPU)
            entries += 1
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return entries, used / entries if entries else 0.0


def measure(requests: list[SimRequest], nodes: int, capacity: int) -> dict[str, float]:
    sim = Simulator(SimConfig(nodes=nodes, capacity_blocks=capacity, policy="cost"))
    t0 = time.perf_counter()
    r = sim.run(requests)
    wall = time.perf_counter() - t0
    entries, per_entry = index_bytes_per_entry(sim)
    return {
        "nodes": nodes,
        "requests": len(requests),
        "hit_rate": r.hit_rate,
        "match_us": r.match_us_mean,
        "route_us": r.route_us_mean,
        "index_entries": entries,
        "index_bytes_per_entry": per_entry,
        "sim_wall_s": wall,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--capacity", type=int, default=500)
    ap.add_argument("--limit", type=int, default=None, help="first K requests for the node sweep")
    ap.add_argument("--route-warm", type=int, default=1000, help="requests indexed before routing")
    ap.add_argument("--route-decisions", type=int, default=1000, help="decisions timed per path")
    ap.add_argument("--lag-events", type=int, default=500)
    ap.add_argument("--lag-speedup", type=float, default=50.0, help="trace pace multiplier for the lag run")
    ap.add_argument("--routes-only", action="store_true", help="skip the simulator sweeps")
    ap.add_argument("--out", type=Path, default=RESULTS, help="folder for scale.json and scale.png")
    ap.add_argument("--smoke", action="store_true", help=f"tiny run: {SMOKE_REQUESTS} requests, {SMOKE}")
    args = ap.parse_args()
    if args.smoke:  # smaller defaults; sizes given on the command line still win
        ap.set_defaults(**SMOKE)
        args = ap.parse_args()
    trace = read_trace(TRACE, limit=SMOKE_REQUESTS if args.smoke else None)
    route_rows = []
    for n in SMOKE_ROUTE_NODES if args.smoke else ROUTE_NODES:
        route_rows.append(asyncio.run(bench_routes(n, trace, args.route_warm, args.route_decisions)))
        print(json.dumps(route_rows[-1]))
    lag = asyncio.run(bench_lag(trace, args.lag_speedup, args.lag_events))
    print(json.dumps(lag))
    print(f"\n{'nodes':>6}{'replica p50/p99 ms':>22}{'(cpu p99)':>11}{'Match RPC p50/p99 ms':>24}{'dict p99 ms':>13}")
    for row in route_rows:
        rep, rpc, d = row["replica"], row["match_rpc"], row["dict_lookup"]
        print(f"{row['nodes']:>6}{rep['p50_ms']:>11.3f} /{rep['p99_ms']:>8.3f}{rep['cpu_p99_ms']:>11.3f}"
              f"{rpc['p50_ms']:>13.3f} /{rpc['p99_ms']:>8.3f}{d['p99_ms']:>13.4f}")
    print(f"replica lag: p50 {lag['lag_p50_ms']:.2f} ms, p99 {lag['lag_p99_ms']:.2f} ms "
          f"at {lag['events_per_s']:.0f} batches/s")
    routes = {
        "route_paths": route_rows,
        "replica_route_p99_ms": {str(r["nodes"]): r["replica"]["p99_ms"] for r in route_rows},
        "replica_route_cpu_p99_ms": {str(r["nodes"]): r["replica"]["cpu_p99_ms"] for r in route_rows},
        "match_rpc_route_p99_ms": {str(r["nodes"]): r["match_rpc"]["p99_ms"] for r in route_rows},
        "replica_lag": lag,
        **({"smoke": True} if args.smoke else {}),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    if args.routes_only:
        old = json.loads((args.out / "scale.json").read_text()) if (args.out / "scale.json").exists() else {}
        line = json.dumps(old | routes, sort_keys=True)
        (args.out / "scale.json").write_text(line + "\n")
        print(line)
        return
    full = prepare(trace)
    sweep = full[: args.limit] if args.limit else full
    by_nodes = []
    for n in SMOKE_SWEEP_NODES if args.smoke else SWEEP_NODES:
        by_nodes.append(measure(sweep, n, args.capacity))
        print(json.dumps(by_nodes[-1]))
    by_trace = []
    for k in (len(full) // 4, len(full) // 2, len(full)):
        by_trace.append(measure(full[:k], 64, args.capacity))
        print(json.dumps(by_trace[-1]))
    base = by_nodes[0]
    print(
        f"\n{'nodes':>6}{'match us':>10}{'route us':>10}{'x 8-node':>10}{'B/entry':>9}{'entries':>9}{'hit':>7}"
    )
    for row in by_nodes:
        print(
            f"{row['nodes']:>6}{row['match_us']:>10.1f}{row['route_us']:>10.1f}{row['route_us'] / base['route_us']:>10.1f}"
            f"{row['index_bytes_per_entry']:>9.0f}{row['index_entries']:>9}{row['hit_rate']:>7.3f}"
        )
    print(f"\n{'requests':>9}{'match us':>10}{'route us':>10}{'B/entry':>9}{'entries':>9}  (64 nodes)")
    for row in by_trace:
        print(
            f"{row['requests']:>9}{row['match_us']:>10.1f}{row['route_us']:>10.1f}"
            f"{row['index_bytes_per_entry']:>9.0f}{row['index_entries']:>9}"
        )

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    xs = [r["nodes"] for r in by_nodes]
    a.plot(xs, [r["route_us"] for r in by_nodes], "o-", label="routing decision")
    a.plot(xs, [r["match_us"] for r in by_nodes], "s-", label="index match")
    a.set(
        xscale="log",
        yscale="log",
        xlabel="nodes",
        ylabel="us / request",
        title="routing overhead (cost policy)",
    )
    a.legend()
    b.plot(xs, [r["index_bytes_per_entry"] for r in by_nodes], "o-")
    b.set(xscale="log", xlabel="nodes", ylabel="bytes / (block, holder) entry", title="index memory")
    fig.tight_layout()
    fig.savefig(args.out / "scale.png", dpi=100)
    out = {
        "capacity_blocks": args.capacity,
        "limit": args.limit,
        "by_nodes": by_nodes,
        "by_trace_64_nodes": by_trace,
        "route_us_512_over_8": by_nodes[-1]["route_us"] / base["route_us"],
        **routes,
    }
    line = json.dumps(out, sort_keys=True)
    (args.out / "scale.json").write_text(line + "\n")
    print(line)


if __name__ == "__main__":
    main()
