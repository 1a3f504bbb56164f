"""How routing overhead and index memory grow with the cluster (8 -> 512 nodes) and the trace.

    python bench/scale.py [--limit K]

For each size it replays the synthetic trace with the `cost` policy (500 blocks per node) and
measures, on this machine: GlobalIndex match latency per request, full routing-decision time per
request (index match + pending match + cost policy over every node), and index memory per
(block, holder) entry (tracemalloc while rebuilding the index from every node's cache snapshot).
Baseline in the same run: the 8-node figures; ratios are against them. Writes
bench/results/scale.json and bench/results/scale.png; the last line printed is the JSON.
"""

import argparse
import json
import time
import tracemalloc
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from radixmesh.cluster.metadata.index import GlobalIndex
from radixmesh.cluster.sim.simulator import SimConfig, SimRequest, Simulator, prepare
from radixmesh.cluster.sim.trace import read_trace
from radixmesh.proto.events import Tier

TRACE = Path(__file__).resolve().parents[1] / "tests" / "data" / "traces" / "synthetic_trace.jsonl"
RESULTS = Path(__file__).resolve().parent / "results"


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
    args = ap.parse_args()
    full = prepare(read_trace(TRACE))
    sweep = full[: args.limit] if args.limit else full
    by_nodes = []
    for n in (8, 32, 128, 512):
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
    RESULTS.mkdir(exist_ok=True)
    fig.savefig(RESULTS / "scale.png", dpi=100)
    out = {
        "capacity_blocks": args.capacity,
        "limit": args.limit,
        "by_nodes": by_nodes,
        "by_trace_64_nodes": by_trace,
        "route_us_512_over_8": by_nodes[-1]["route_us"] / base["route_us"],
    }
    line = json.dumps(out, sort_keys=True)
    (RESULTS / "scale.json").write_text(line + "\n")
    print(line)


if __name__ == "__main__":
    main()
