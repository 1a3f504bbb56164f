"""The engine simulator against the live modeled cluster: each committed live `radixmesh bench` result
replayed cell for cell with `--simulate`, side by side.

    python bench/sim_fidelity.py [LIVE_BENCH_JSON ...] [--out DIR] [--smoke]

Each live bench.json's own command is run again with --simulate, at the rates its cells ran (fixed),
so the simulated cells are the live ones' (same workload, seed, arms, agents, engine and speed-up).
Per cell: goodput, SLO attainment, TTFT p50 and p99, hit rate, live and simulated, and their ratio;
per rate with both `cost` and `prefix_affinity`: the cost/affinity goodput ratio on each side, and
whether the arms rank the same by goodput. Writes OUT/sim_fidelity.json (OUT/<name>/bench.json each
replay). A live result was measured at its own revision (settings.revision); the replay runs this one.

--smoke: the first live result's first rate, a 2 s window: so the script cannot rot, not a
measurement; marked "smoke": true.
"""

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
LIVE = [
    RESULTS / "router_tie_rank_modeled_h100_8_x001" / w / "bench.json" for w in ("docs_45.6", "agent_33.75", "convo_45.6")
] + [RESULTS / "docs_modeled_h100_16_x001_tie_rank" / r / "bench.json" for r in ("docs_68.4", "docs_91_114")]
"""The live cells at the router this replay runs (the near-tie rule, ea45697): 8 and 16 modeled agents."""
DROPPED = {"--out": 1, "--rates": 1, "--find-knee": 0, "--fixed-rates": 0, "--past-knee": 1, "--max-rates": 1,
           "--rate-factor": 1}
"""Options of a live command the replay sets itself, with how many values each takes."""
FIGURES = {
    "goodput_rps": lambda c: c["goodput_rps"],
    "slo_attainment": lambda c: c["slo_attainment"],
    "ttft_p50_s": lambda c: c["ttft_s"].get("p50", 0.0),
    "ttft_p99_s": lambda c: c["ttft_s"].get("p99", 0.0),
    "hit_rate": lambda c: c["hit_rate"],
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Replay live bench results in the engine simulator, side by side.")
    p.add_argument("live", nargs="*", type=Path, help="live bench.json files [default: the committed 8- and "
                   "16-agent router cells]")
    p.add_argument("--out", type=Path, default=RESULTS / "sim_fidelity")
    p.add_argument("--smoke", action="store_true", help="a tiny run, so the script cannot rot (not a measurement)")
    args = p.parse_args(argv)
    args.live = args.live or LIVE[:1] if args.smoke else args.live or LIVE
    return args


def replay_command(live: dict[str, Any], out: Path, smoke: bool) -> list[str]:
    """The live result's `radixmesh bench` arguments, at its cells' rates, with --simulate into `out`."""
    words = shlex.split(live["settings"]["command"])[2:]  # past "radixmesh bench"
    kept: list[str] = []
    skip = 0
    for w in words:
        if skip:
            skip -= 1
        elif w in DROPPED:
            skip = DROPPED[w]
        else:
            kept.append(w)
    rates = sorted({c["rate_rps"] for c in live["cells"]})[:1 if smoke else None]
    short = ["--duration", "2", "--ramp", "1", "--drain", "5"] if smoke else []
    return [*kept, *short, "--rates", ",".join(f"{r:g}" for r in rates), "--fixed-rates", "--simulate",
            "--out", str(out)]


def ratio(simulated: float, live: float) -> float | None:
    return simulated / live if live else None


def compare(live: dict[str, Any], simulated: dict[str, Any]) -> dict[str, Any]:
    """Per cell each figure on both sides; per rate the cost/affinity ratio and the arms' ranking."""
    sim = {(c["arm"], round(c["rate_rps"], 6)): c for c in simulated["cells"]}
    cells: list[dict[str, Any]] = []
    rates: dict[float, dict[str, tuple[float, float]]] = {}
    for c in live["cells"]:
        key = (c["arm"], round(c["rate_rps"], 6))
        s = sim.get(key)
        if s is None:
            continue
        cells.append({"arm": c["arm"], "rate_rps": c["rate_rps"],
                      **{n: {"live": get(c), "simulated": get(s), "ratio": ratio(get(s), get(c))}
                         for n, get in FIGURES.items()}})
        rates.setdefault(key[1], {})[c["arm"]] = (c["goodput_rps"], s["goodput_rps"])
    by_rate = []
    for rate, arms in sorted(rates.items()):
        row: dict[str, Any] = {"rate_rps": rate,
                               "live_ranking": sorted(arms, key=lambda a: -arms[a][0]),
                               "simulated_ranking": sorted(arms, key=lambda a: -arms[a][1])}
        if "cost" in arms and "prefix_affinity" in arms:
            (lc, sc), (la, sa) = arms["cost"], arms["prefix_affinity"]
            row["cost_over_affinity"] = {"live": ratio(lc, la), "simulated": ratio(sc, sa)}
        by_rate.append(row)
    return {"live_revision": live["settings"].get("revision"), "command": live["settings"]["command"],
            "cells": cells, "rates": by_rate}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    runs = []
    for path in args.live:
        live = json.loads(path.read_text())
        name = f"{path.parent.parent.name}-{path.parent.name}" if path.parent.parent != RESULTS else path.parent.name
        out = args.out / name
        command = replay_command(live, out, args.smoke)
        print(f"{name}: radixmesh bench {' '.join(command)}", flush=True)
        subprocess.run([sys.executable, "-m", "radixmesh.cluster.cli", "bench", *command], check=True,
                       stdout=subprocess.DEVNULL)
        simulated = json.loads((out / "bench.json").read_text())
        if args.smoke:  # no smoke figure is to be read as a measurement, the replay's own file included
            (out / "bench.json").write_text(json.dumps({**simulated, "smoke": True}, indent=2) + "\n")
        runs.append({"live": str(path.relative_to(RESULTS.parent.parent)) if path.is_relative_to(RESULTS.parent.parent)
                     else str(path), **compare(live, simulated)})
    result = {"smoke": args.smoke,
              "label": "SIMULATED (engine simulator) against the live MODELED cluster, the same bench cells",
              "runs": runs}
    (args.out / "sim_fidelity.json").write_text(json.dumps(result, indent=2) + "\n")
    for run in runs:
        print(run["live"])
        for c in run["cells"]:
            print(f"  {c['arm']:>16} {c['rate_rps']:>7g}/s " + "  ".join(
                f"{n} {c[n]['live']:.3g}/{c[n]['simulated']:.3g}" for n in FIGURES))
        for r in run["rates"]:
            x = r.get("cost_over_affinity")
            print(f"  {r['rate_rps']:g}/s ranking live {r['live_ranking']} simulated {r['simulated_ranking']}"
                  + (f"; cost/affinity live {x['live']:.2f}x simulated {x['simulated']:.2f}x" if x and x["live"]
                     and x["simulated"] else ""))
    print(f"live/simulated; wrote {args.out / 'sim_fidelity.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
