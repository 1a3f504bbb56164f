"""Two real routers on the trace replay: hit rate next to one router, measured in the same run.

    python bench/two_routers.py [--requests 200] [--concurrency 4] [--trace mooncake|synthetic] [--out DIR] [--smoke]

Real parts, in this process: a metadata gRPC service on 127.0.0.1, NODES NodeAgents publishing their
cache events to it, and Router instances, each with its own index replica fed by WatchIndex; with two
routers request i goes to router i % 2. Rows: one router (twice: the run-to-run noise), two routers,
and two routers that ignore each other's routed work. Hit rate: prompt tokens served from cache /
prompt tokens. The setup and rows in full: docs/benchmarks.md#benchtwo_routerspy.
Writes DIR/two_routers.json (default bench/results); the last line printed is the JSON.
"""

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: tests.support is a package there
from radixmesh.cluster.fleet.agent_client import LocalAgentClient, StaticAgentDirectory
from radixmesh.cluster.policy.base import PolicyConfig
from radixmesh.cluster.router.router import Router
from radixmesh.cluster.sim.trace import read_trace
from radixmesh.cluster.sim.trace_replay import ReplayConfig, fit
from radixmesh.common.metadata.auth import CallerCredentials
from radixmesh.common.metadata.client import MetadataClient
from radixmesh.node_agent.agent import NodeAgent
from radixmesh.proto.serve.plan import ServePlan
from radixmesh.proto.serve.sampling import SamplingParams
from tests.support.router_cluster import SECRET, agent_config, router_config, start_metadata

TRACES = Path(__file__).resolve().parents[1] / "tests" / "data" / "traces"
TRACE_FILES = {"mooncake": TRACES / "mooncake_trace_1000.jsonl", "synthetic": TRACES / "synthetic_trace.jsonl"}
RESULTS = Path(__file__).resolve().parent / "results"
NODES, CAPACITY, MAX_BLOCKS, BS = 3, 48, 24, 4
"""As tests/ray/test_sim_vs_cluster.py: 3 nodes of 48 blocks, prompts cut to 24 blocks of 4 tokens."""
REPLAY = ReplayConfig(block_size=BS, max_prompt_blocks=MAX_BLOCKS, max_tokens=1)
SMOKE = {"requests": 20}


@dataclass(frozen=True, slots=True)
class RunResult:
    hit_rate: float
    prompt_tokens: int
    hit_tokens: int
    replica_decisions: int
    """Decisions made on a router's in-sync replica (the rest asked Match)."""
    wall_s: float


def prompts(trace: str, requests: int) -> list[tuple[int, ...]]:
    """The replayed prompts, in trace order."""
    fitted = fit(read_trace(TRACE_FILES[trace], limit=requests), REPLAY)
    return [tuple(REPLAY.mapping.tokens(r)) for r in fitted]


async def run(replayed: list[tuple[int, ...]], *, routers: int, share_work: bool = True,
              concurrency: int = 4, seed: int = 0) -> RunResult:
    """Replay `replayed` through `routers` routers (round-robin) on a fresh cluster."""
    server, port = await start_metadata()
    address = f"127.0.0.1:{port}"
    agents = [NodeAgent(agent_config(chr(ord("a") + i), address, gpu_blocks=CAPACITY)) for i in range(NODES)]
    clients = [MetadataClient(address, credentials=CallerCredentials.cluster(SECRET), timeout_s=5.0)
               for _ in range(routers)]
    fleet: list[Router] = []
    try:
        for a in agents:
            await a.start()
        layout = agents[0].layout
        config = router_config(layout.fingerprint(), policy_config=PolicyConfig(block_bytes=layout.block_bytes))
        directory = StaticAgentDirectory([LocalAgentClient(a) for a in agents])
        fleet = [Router(config, directory, c, rng=random.Random(seed + k)) for k, c in enumerate(clients)]
        for r in fleet:
            assert r.watcher is not None
            if not share_work:
                r.watcher.on_update = None  # the ablation: other routers' RoutedWork never reaches the load table
            r.start()
        await _replicas_see_all(fleet, len(agents))
        queue = list(enumerate(replayed))
        totals = {"prompt": 0, "hits": 0}

        async def client() -> None:
            while queue:
                i, tokens = queue.pop(0)
                request = ServePlan(f"r{i}", tokens, SamplingParams(max_tokens=1, temperature=0.0))
                result = await fleet[i % routers].complete(request)
                totals["prompt"] += len(tokens)
                totals["hits"] += result.cached_tokens

        t0 = time.monotonic()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        wall = time.monotonic() - t0
        for r in fleet:
            r.check_invariants()
        return RunResult(totals["hits"] / totals["prompt"], totals["prompt"], totals["hits"],
                         sum(r.replica_decisions for r in fleet), wall)
    finally:
        for r in fleet:
            await r.close()
        for a in agents:
            await a.stop()
        for c in clients:
            await c.close()
        await server.stop(0)


async def _replicas_see_all(fleet: list[Router], nodes: int, timeout_s: float = 30.0) -> None:
    """Wait until every router's replica is in sync and lists every agent as live (they register
    on start): the first requests are then routed on the replica, as in steady state."""
    deadline = time.monotonic() + timeout_s
    while not all(r.watcher is not None and r.watcher.replica.in_sync and len(r.watcher.replica.nodes()) == nodes
                  for r in fleet):
        if time.monotonic() > deadline:
            raise TimeoutError("router replicas did not see every agent")
        await asyncio.sleep(0.02)  # polling the replicas' state, not a synchronisation of the replay


async def compare(replayed: list[tuple[int, ...]], concurrency: int) -> dict[str, object]:
    one = await run(replayed, routers=1, concurrency=concurrency)
    again = await run(replayed, routers=1, concurrency=concurrency, seed=1)
    two = await run(replayed, routers=2, concurrency=concurrency)
    unshared = await run(replayed, routers=2, share_work=False, concurrency=concurrency)
    return {
        "requests": len(replayed), "concurrency": concurrency, "nodes": NODES, "capacity_blocks": CAPACITY,
        "one_router": one.hit_rate, "two_routers": two.hit_rate, "two_routers_unshared_work": unshared.hit_rate,
        "two_minus_one_points": 100 * (two.hit_rate - one.hit_rate),
        "one_router_again": again.hit_rate,
        "one_router_run_to_run_points": 100 * (again.hit_rate - one.hit_rate),
        "unshared_minus_shared_points": 100 * (unshared.hit_rate - two.hit_rate),
        "ratio_two_over_one": two.hit_rate / one.hit_rate if one.hit_rate else 0.0,
        "replica_decisions": {"one": one.replica_decisions, "two": two.replica_decisions,
                              "two_unshared": unshared.replica_decisions},
        "wall_s": {"one": one.wall_s, "two": two.wall_s, "two_unshared": unshared.wall_s},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--trace", choices=sorted(TRACE_FILES), default="mooncake")
    ap.add_argument("--out", type=Path, default=RESULTS, help="folder for two_routers.json")
    ap.add_argument("--smoke", action="store_true", help=f"tiny run: {SMOKE}")
    args = ap.parse_args()
    if args.smoke:  # smaller defaults; sizes given on the command line still win
        ap.set_defaults(**SMOKE)
        args = ap.parse_args()
    row = {"trace": args.trace, **asyncio.run(compare(prompts(args.trace, args.requests), args.concurrency))}
    print(f"one router {row['one_router']:.4f}  two routers {row['two_routers']:.4f}  "
          f"(two - one: {row['two_minus_one_points']:+.2f} points, ratio {row['ratio_two_over_one']:.3f})  "
          f"two, unshared work {row['two_routers_unshared_work']:.4f}  "
          f"(one router run to run: {row['one_router_run_to_run_points']:+.2f} points)")
    if args.smoke:
        row["smoke"] = True
    args.out.mkdir(parents=True, exist_ok=True)
    line = json.dumps(row, sort_keys=True)
    (args.out / "two_routers.json").write_text(line + "\n")
    print(line)


if __name__ == "__main__":
    main()
