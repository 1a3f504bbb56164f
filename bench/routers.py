"""Router replicas on the trace: hit rate of 1 vs 2 routers, and what each one's private state costs.

    python bench/routers.py [--nodes 8 64] [--limit K] [--out DIR] [--smoke]

The simulator (production GlobalIndex, caches and `cost` policy) routes the synthetic trace with
SimConfig.routers behind a round-robin balancer. Routers share the index (each with an in-sync
replica: replica lag, ~2 ms p50 in bench/scale.py, is far below the trace's event spacing) and keep
their own pending (speculative) holders and recent-work load table. Rows: one router (the baseline,
same run), two routers, two sharing pending holders, two sharing pending holders and load. All with
the replica's candidate set (prefix holders + 4 least loaded), and one router scoring every node for
comparison. Writes DIR/routers.json (default bench/results); the last line printed is the JSON.
"""

import argparse
import json
from pathlib import Path

from radixmesh.cluster.sim.config import SimConfig
from radixmesh.cluster.sim.simulator import SimRequest, Simulator, prepare
from radixmesh.cluster.sim.trace import read_trace

TRACE = Path(__file__).resolve().parents[1] / "tests" / "data" / "traces" / "synthetic_trace.jsonl"
RESULTS = Path(__file__).resolve().parent / "results"
SMOKE = {"nodes": [8], "limit": 200}


def run(requests: list[SimRequest], nodes: int, *, routers: int = 1, candidates: int = 4,
        shared_pending: bool = False, shared_load: bool = False) -> float:
    sim = Simulator(SimConfig(nodes=nodes, capacity_blocks=500, candidates=candidates, routers=routers,
                              shared_pending=shared_pending))
    if shared_load:
        sim.share_recent_work()
    return sim.run(requests).hit_rate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, nargs="+", default=[8, 64])
    ap.add_argument("--limit", type=int, default=None, help="first K requests of the trace")
    ap.add_argument("--out", type=Path, default=RESULTS, help="folder for routers.json")
    ap.add_argument("--smoke", action="store_true", help=f"tiny run: {SMOKE}")
    args = ap.parse_args()
    if args.smoke:  # smaller defaults; sizes given on the command line still win
        ap.set_defaults(**SMOKE)
        args = ap.parse_args()
    requests = prepare(read_trace(TRACE, limit=args.limit))
    rows = []
    for n in args.nodes:
        row = {
            "nodes": n,
            "one_router_all_nodes": run(requests, n, candidates=0),
            "one_router": run(requests, n),
            "two_routers": run(requests, n, routers=2),
            "two_routers_shared_pending": run(requests, n, routers=2, shared_pending=True),
            "two_routers_shared_pending_and_load": run(requests, n, routers=2, shared_pending=True, shared_load=True),
        }
        row["two_minus_one_points"] = 100 * (row["two_routers"] - row["one_router"])
        rows.append(row)
        print(json.dumps(row))
    print(f"\n{'nodes':>6}{'1 (all)':>9}{'1':>8}{'2':>8}{'2+pend':>8}{'2+pend+load':>13}{'2-1 pts':>9}")
    for r in rows:
        print(f"{r['nodes']:>6}{r['one_router_all_nodes']:>9.4f}{r['one_router']:>8.4f}{r['two_routers']:>8.4f}"
              f"{r['two_routers_shared_pending']:>8.4f}{r['two_routers_shared_pending_and_load']:>13.4f}"
              f"{r['two_minus_one_points']:>9.2f}")
    args.out.mkdir(parents=True, exist_ok=True)
    doc: dict[str, object] = {"by_nodes": rows}
    if args.smoke:
        doc["smoke"] = True
    line = json.dumps(doc, sort_keys=True)
    (args.out / "routers.json").write_text(line + "\n")
    print(line)


if __name__ == "__main__":
    main()
