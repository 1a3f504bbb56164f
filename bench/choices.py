"""OpenAI `n` through the router: one request with n choices vs the same n requests sent at once.

Same run, same two in-process agents (tiny model by default), same prompts and seeds: each round
sends a fresh prompt (its prefix cached nowhere) either as one /v1/completions with `n` (choices
2..n pinned to the first's node, reusing its prefix) or as n concurrent requests with seed + i (the
baseline a client without `n` would send). There is no metadata service here, so the router spreads
the separate requests by load (least_loaded) while `n` keeps its choices on one node: the figures
show what pinning saves where load balancing would otherwise scatter one prompt's copies. Reports
prompt tokens computed and wall time per round, checks that both give the same texts, prints ONE
JSON line, also written to DIR/choices.json (--out DIR, default bench/results).
"""

import argparse
import asyncio
import json
import random
import statistics
import time
from pathlib import Path

import aiohttp
import torch

from radixmesh.cluster.api.app import start_http
from radixmesh.cluster.fleet.agent_client import LocalAgentClient, StaticAgentDirectory
from radixmesh.cluster.router.config import RouterConfig
from radixmesh.cluster.router.router import Router
from radixmesh.node_agent.agent import NodeAgent
from radixmesh.node_agent.config import AgentConfig
from radixmesh.node_agent.engine.config import EngineConfig
from radixmesh.node_agent.memory.config import MemoryConfig
from radixmesh.node_agent.model.source import resolve_model
from radixmesh.proto.ids import NodeId

RESULTS = Path(__file__).parent / "results"
MODEL = "bench"
SMOKE = {"n": 2, "prompt": 64, "max_tokens": 2, "rounds": 1, "blocks": 128}


async def run(args: argparse.Namespace) -> dict[str, object]:
    source = resolve_model(args.model)
    engine = EngineConfig(block_size=16, memory=MemoryConfig(num_gpu_blocks=args.blocks))
    agents = [NodeAgent(AgentConfig(NodeId(f"n{i}"), model=source, served_model_name=MODEL, engine=engine,
                                    transfer="none")) for i in range(2)]
    for a in agents:
        await a.start()
    layout = agents[0].layout
    config = RouterConfig(layout.fingerprint(), block_size=16, model_name=MODEL,
                          limits=source.config.prompt_limits())
    router = Router(config, StaticAgentDirectory([LocalAgentClient(a) for a in agents]), None,
                    rng=random.Random(0))
    runner, port = await start_http(router, "127.0.0.1", 0, log_access=False)
    url = f"http://127.0.0.1:{port}/v1/completions"
    rng = random.Random(1)
    figures: dict[str, list[float]] = {"n_s": [], "separate_s": [], "n_computed": [], "separate_computed": []}
    try:
        async with aiohttp.ClientSession() as http:
            async def post(body: dict[str, object]) -> list[str]:
                async with http.post(url, json=body) as r:
                    doc = await r.json()
                    assert r.status == 200, doc
                    return [c["text"] for c in doc["choices"]]

            for round_ in range(args.rounds):
                for mode in ("n", "separate"):
                    # A fresh prompt per mode and round: nothing of it is cached anywhere yet.
                    prompt = [rng.randrange(3, 256) for _ in range(args.prompt)]
                    body = {"model": MODEL, "prompt": prompt, "max_tokens": args.max_tokens, "temperature": 1.0,
                            "ignore_eos": True}
                    computed = router.metrics.total.tokens.computed
                    start = time.perf_counter()
                    if mode == "n":
                        texts = await post({**body, "seed": 7, "n": args.n})
                    else:
                        answers = await asyncio.gather(*(post({**body, "seed": 7 + i}) for i in range(args.n)))
                        texts = [t for a in answers for t in a]
                    figures[f"{mode}_s"].append(time.perf_counter() - start)
                    figures[f"{mode}_computed"].append(router.metrics.total.tokens.computed - computed)
                    assert len(texts) == args.n, texts
                # Same seeds, same texts: choice i of `n` is request i of the baseline.
                if round_ == 0:
                    same = await post({**body, "seed": 7, "n": args.n})
                    assert same == texts, "choices differ from the separate requests with seed + i"
    finally:
        await runner.cleanup()
        for a in agents:
            await a.stop()
    n_s, sep_s = statistics.median(figures["n_s"]), statistics.median(figures["separate_s"])
    n_c, sep_c = statistics.median(figures["n_computed"]), statistics.median(figures["separate_computed"])
    print(f"model={args.model} n={args.n} prompt={args.prompt} tokens max_tokens={args.max_tokens} "
          f"rounds={args.rounds} (2 agents in this process, torch threads {args.threads})")
    print(f"one request with n:  {n_c:.0f} prompt tokens computed, {n_s * 1e3:.0f} ms (median)")
    print(f"{args.n} separate requests: {sep_c:.0f} prompt tokens computed, {sep_s * 1e3:.0f} ms (median)")
    return {
        "model": args.model, "n": args.n, "prompt_tokens": args.prompt, "max_tokens": args.max_tokens,
        "computed_prompt_tokens_n": n_c, "computed_prompt_tokens_separate": sep_c,
        "ratio_computed_n_vs_separate": round(n_c / sep_c, 4),
        "seconds_n": round(n_s, 4), "seconds_separate": round(sep_s, 4),
        "ratio_seconds_n_vs_separate": round(n_s / sep_s, 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="random-tiny", help="model SPEC (see radixmesh up --help)")
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--blocks", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: steady on shared cores)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for choices.json")
    parser.add_argument("--smoke", action="store_true", help=f"tiny run: {SMOKE}")
    args = parser.parse_args()
    if args.smoke:  # smaller defaults; sizes given on the command line still win
        parser.set_defaults(**SMOKE)
        args = parser.parse_args()
    torch.set_num_threads(args.threads)
    result = asyncio.run(run(args))
    if args.smoke:
        result["smoke"] = True
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "choices.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
