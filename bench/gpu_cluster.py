"""A 2-agent cluster on one device serving a real model: TTFT cached vs uncached, decode tokens/s and
the pull rate between the two agents against a device copy, all measured in the same run.

`bench/gpu_check.py` calls `run` on a lent GPU (its cluster step); on a CPU the tiny model runs it:

    python bench/gpu_cluster.py [--model smollm2-135m-instruct] [--trials 5] [--out DIR]
    python bench/gpu_cluster.py --smoke --out DIR    # tiny model, 2 trials of 128 tokens

The setup, the three plans and the baselines: docs/benchmarks.md#benchgpu_clusterpy.
"""

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import ray
import torch

from radixmesh.cluster.fleet.agent_client import RayAgentClient
from radixmesh.cluster.launch.local_ray import init_loopback_ray
from radixmesh.common.secret import ClusterSecret
from radixmesh.node_agent.actor import AgentPlacement, make_agent_actor, node_resource
from radixmesh.node_agent.config import AgentConfig
from radixmesh.node_agent.engine.config import EngineConfig
from radixmesh.node_agent.memory.config import MemoryConfig
from radixmesh.node_agent.model.source import ModelSource, resolve_model
from radixmesh.node_agent.transfer.ucx_env import ucx_env
from radixmesh.proto.ids import NodeId
from radixmesh.proto.serve.plan import PullPlan, ServePlan, ServeResult
from radixmesh.proto.serve.sampling import SamplingParams

RESULTS = Path(__file__).parent / "results"
BLOCK_SIZE = 16
NODES = (NodeId("gpu-a"), NodeId("gpu-b"))
PARAGRAPH = ("The cluster keeps every prefix it has computed in a paged cache, and the router sends each "
             "request to the node that holds the longest part of its prompt. ")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="A 2-agent cluster on one device: TTFT, decode rate, pull rate.")
    p.add_argument("--model", default="smollm2-135m-instruct", help="--model SPEC of the agents")
    p.add_argument("--prefix-tokens", type=int, default=1024, help="shared prefix length per trial")
    p.add_argument("--decode-tokens", type=int, default=128, help="tokens of the decode-rate request")
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--out", type=Path, default=RESULTS, help="folder for gpu_cluster.json")
    p.add_argument("--smoke", action="store_true", help="tiny model, 2 trials of 128 tokens, 16 decode tokens")
    args = p.parse_args(argv)
    if args.smoke:  # smaller defaults; sizes given on the command line still win
        p.set_defaults(model="random-tiny", trials=2, prefix_tokens=128, decode_tokens=16)
        args = p.parse_args(argv)
    return args


def agent_config(node: NodeId, source: ModelSource, secret: ClusterSecret, on_gpu: bool) -> AgentConfig:
    # On a GPU each agent sizes its pool from its share of the device; on a CPU, a fixed pool.
    memory = MemoryConfig(num_gpu_blocks=512)
    return AgentConfig(node, model=source, engine=EngineConfig(block_size=BLOCK_SIZE, memory=memory),
                       gpu_memory_utilization=0.35 if on_gpu else None, transfer="ucx", secret=secret)


def placement(node: NodeId, on_gpu: bool) -> AgentPlacement:
    env = ucx_env(loopback=True)
    if on_gpu:  # UCX may move device memory itself (cuda_copy, cuda_ipc between processes of one GPU)
        env = {**env, "UCX_TLS": "sm,tcp,self,cuda_copy,cuda_ipc"}
    return AgentPlacement(num_gpus=0.5 if on_gpu else 0.0, resources=((node_resource(node), 1.0),),
                          env_vars=tuple(env.items()), max_restarts=0)


def prompt_of(tokenizer_encode: Any, trial: int, prefix_tokens: int) -> tuple[int, ...]:
    """A ~prefix_tokens prompt whose first words make it unique to `trial` (no hit across trials)."""
    head = f"Trial {trial} of the benchmark. "
    text = head + PARAGRAPH * (prefix_tokens // 20 + 1)
    ids: list[int] = tokenizer_encode(text)
    return tuple(ids[:prefix_tokens]) + tuple(tokenizer_encode(" In one sentence, what does the router do?"))


async def serve(client: RayAgentClient, plan: ServePlan) -> ServeResult:
    async for item in client.serve(plan):
        if isinstance(item, ServeResult):
            return item
    raise AssertionError("the agent's stream ended without a result")


def copy_gbps(nbytes: int, device: torch.device) -> float:
    """Bytes per second of a copy of `nbytes` on `device` (median of 10), the pull's baseline."""
    src = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    times = []
    for _ in range(10):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        dst.copy_(src)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    return nbytes / statistics.median(times) / 1e9


async def measure(clients: tuple[RayAgentClient, RayAgentClient], source: ModelSource,
                  args: argparse.Namespace) -> dict[str, Any]:
    a, b = clients
    info_a = await a.start()
    await b.start()
    tokenizer = source.tokenizer()
    greedy = SamplingParams(max_tokens=16, ignore_eos=True, seed=0)
    rows: list[dict[str, Any]] = []
    for trial in range(args.trials):
        tokens = prompt_of(tokenizer.encode, trial, args.prefix_tokens)
        full = len(tokens) // BLOCK_SIZE
        uncached = await serve(a, ServePlan(f"u{trial}", tokens, greedy))
        local = await serve(a, ServePlan(f"l{trial}", tokens, greedy))
        pull = PullPlan(info_a.node_id, info_a.transfer_address, 0, full)
        pulled = await serve(b, ServePlan(f"p{trial}", tokens, greedy, pull=pull))
        rows.append({
            "prompt_tokens": len(tokens),
            "ttft_uncached_s": uncached.stats.ttft_s, "ttft_local_s": local.stats.ttft_s,
            "ttft_pulled_s": pulled.stats.ttft_s,
            "pull_bytes": pulled.stats.pull_bytes, "pull_seconds": pulled.stats.pull_seconds,
            "pull_failed": pulled.stats.pull_failed,
            "same_tokens": uncached.output_token_ids == local.output_token_ids == pulled.output_token_ids,
        })
    decode = await serve(a, ServePlan("decode", prompt_of(tokenizer.encode, args.trials, 64),
                                      SamplingParams(max_tokens=args.decode_tokens, ignore_eos=True, seed=0)))
    return {"rows": rows, "decode_tokens": len(decode.output_token_ids), "decode_s": decode.stats.decode_s}


def summarize(measured: dict[str, Any], device: torch.device) -> dict[str, Any]:
    rows = measured["rows"]

    def median(key: str) -> float:
        return float(statistics.median(r[key] for r in rows))

    pulls = [r for r in rows if r["pull_bytes"] and r["pull_seconds"] > 0]
    pull_gbps = statistics.median(r["pull_bytes"] / r["pull_seconds"] / 1e9 for r in pulls) if pulls else 0.0
    baseline = copy_gbps(int(statistics.median(r["pull_bytes"] for r in pulls)) if pulls else 1 << 20, device)
    decode_tps = (measured["decode_tokens"] - 1) / measured["decode_s"] if measured["decode_s"] > 0 else 0.0
    return {
        "ttft_uncached_s": round(median("ttft_uncached_s"), 4),
        "ttft_local_s": round(median("ttft_local_s"), 4),
        "ttft_pulled_s": round(median("ttft_pulled_s"), 4),
        "ttft_local_over_uncached": round(median("ttft_local_s") / median("ttft_uncached_s"), 3),
        "ttft_pulled_over_uncached": round(median("ttft_pulled_s") / median("ttft_uncached_s"), 3),
        "decode_tokens_per_s": round(decode_tps, 1),
        "pull_gbps": round(pull_gbps, 3),
        "copy_gbps": round(baseline, 3),
        "pull_over_copy": round(pull_gbps / baseline, 4) if baseline else 0.0,
        "pulls_failed": sum(bool(r["pull_failed"]) for r in rows),
        "outputs_identical": all(r["same_tokens"] for r in rows),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Start Ray on this machine with the two agents, measure, stop; the JSON result."""
    on_gpu = torch.cuda.is_available()
    device = torch.device("cuda" if on_gpu else "cpu")
    source = resolve_model(args.model)
    secret = ClusterSecret.generate()
    init_loopback_ray(num_cpus=4, num_gpus=1 if on_gpu else 0, resources={node_resource(n): 1.0 for n in NODES},
                      log_to_driver=False, configure_logging=False)
    try:
        clients = tuple(RayAgentClient(n, make_agent_actor(agent_config(n, source, secret, on_gpu),
                                                           placement(n, on_gpu))) for n in NODES)
        measured = asyncio.run(measure((clients[0], clients[1]), source, args))
    finally:
        ray.shutdown()
    return {"bench": "gpu_cluster", "device": torch.cuda.get_device_name() if on_gpu else "cpu",
            "model": source.name, "prefix_tokens": args.prefix_tokens, "trials": args.trials,
            **summarize(measured, device), "rows": measured["rows"]}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    if args.smoke:
        result["smoke"] = True  # never mistaken for a measurement
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_cluster.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}))
    return 0 if result["outputs_identical"] and not result["pulls_failed"] else 1


if __name__ == "__main__":
    sys.exit(main())
