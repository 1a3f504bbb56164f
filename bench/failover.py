"""Kill the active metadata service under load: failover time and failed requests.

    python bench/failover.py [--runs 3] [--after 3] [--out bench/results] [--smoke]

Each run (tests/support/failover_cluster.py): a redis-server, an active and a standby metadata service
process on it, 2 in-process agents (tiny model), a router listing both services, 3 clients sending
requests back to back; SIGKILL the active after 2 s. Reported per run and as the worst run: the
kill until a client's first answer from the standby (`takeover_s`), requests failed, and the
longest time the router's replica listed a block its node had evicted. The baseline in the same
run is the floor of the takeover: the leader key's ttl (the standby cannot take over before the
dead active's key expires), so `takeover_over_leader_ttl` is the share of the takeover that is
ours. Writes OUT/failover.json; the last line printed is the JSON. --smoke: one run, 1 client,
0.5 s of load either side of the kill, marked "smoke": true.
"""

import argparse
import asyncio
import json
import sys
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: tests.support is a package there
from tests.support.failover_cluster import LEADER_TTL_S, run_failover

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--after", type=float, default=3.0, help="seconds of load after the takeover")
    ap.add_argument("--out", type=Path, default=RESULTS, help="folder of failover.json")
    ap.add_argument("--smoke", action="store_true", help="one short run, so the bench cannot rot (not a measurement)")
    args = ap.parse_args()
    # The smoke run keeps the real kill and takeover; only the load around them shrinks.
    one_run = (partial(run_failover, clients=1, before_s=0.5, after_s=0.5) if args.smoke
               else partial(run_failover, after_s=args.after))
    runs = []
    for i in range(1 if args.smoke else args.runs):
        result = asyncio.run(one_run())
        runs.append(result.as_dict())
        print(f"run {i}: takeover {result.takeover_s:.3f} s (standby serving {result.standby_serving_s:.3f} s), {result.failed}/{result.requests} requests failed, "
              f"replica stale at most {result.stale_max_s * 1000:.0f} ms", flush=True)
    worst = max(r["takeover_s"] for r in runs)  # type: ignore[type-var]
    summary = {
        "runs": runs,
        "takeover_max_s": worst,
        "requests_failed": sum(r["requests_failed"] for r in runs),  # type: ignore[misc]
        "replica_stale_max_s": max(r["replica_stale_max_s"] for r in runs),  # type: ignore[type-var]
        "leader_ttl_s": LEADER_TTL_S,
        "takeover_over_leader_ttl": worst / LEADER_TTL_S,  # type: ignore[operator]
        "machine": "shared 2-core CPU box",
        "smoke": args.smoke,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    line = json.dumps(summary, sort_keys=True)
    (args.out / "failover.json").write_text(line + "\n")
    print(line)


if __name__ == "__main__":
    main()
