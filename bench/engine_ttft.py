"""TTFT with a cached 1,024-token prefix vs the same requests with prefix caching off.

Same run, same model (--model SPEC: "random-tiny" by default, or e.g. smollm2-135m-instruct), same requests:
each is the shared prefix plus
its own 32-token suffix, served one at a time (so TTFT is prefill, not queueing). The cached engine
is warmed by one request carrying the prefix; the baseline engine has caching disabled. Prints the
figures, then ONE JSON line, also written to DIR/engine_ttft[_<model>].json (--out DIR, default
bench/results).
"""

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import torch

from radixmesh.node_agent.engine.config import EngineConfig
from radixmesh.node_agent.engine.engine import Engine
from radixmesh.node_agent.engine.request import Request, RequestId, RequestOutput
from radixmesh.node_agent.memory.config import MemoryConfig
from radixmesh.node_agent.model.llama import LlamaForCausalLM
from radixmesh.node_agent.model.source import resolve_model
from radixmesh.proto.serve.sampling import SamplingParams

RESULTS = Path(__file__).parent / "results"
DEFAULT_MODEL = "random-tiny"
SMOKE = {"requests": 2, "prefix": 64, "suffix": 16}


def serve_one_by_one(model: LlamaForCausalLM, model_id: str, caching: bool, requests: list[Request],
                     warmup: Request) -> list[RequestOutput]:
    memory = MemoryConfig(num_gpu_blocks=512, enable_prefix_caching=caching)
    engine = Engine(model, EngineConfig(model_id=model_id, memory=memory), clock=time.perf_counter)
    engine.generate([warmup])
    outputs = [engine.generate([r])[0] for r in requests]
    engine.check_invariants()
    return outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--prefix", type=int, default=1024)
    parser.add_argument("--suffix", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: steady on shared cores)")
    parser.add_argument("--model", default=DEFAULT_MODEL, help="model SPEC (see radixmesh up --help)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the JSON result")
    parser.add_argument("--smoke", action="store_true", help=f"tiny run: {SMOKE}")
    args = parser.parse_args()
    if args.smoke:  # smaller defaults; sizes given on the command line still win
        parser.set_defaults(**SMOKE)
        args = parser.parse_args()
    torch.set_num_threads(args.threads)

    source = resolve_model(args.model)
    model = source.load()
    rng = random.Random(0)
    # Token ids below 256 exist in every vocabulary; the engine never detokenizes them.
    prefix = [rng.randrange(256) for _ in range(args.prefix)]
    params = SamplingParams(max_tokens=4, ignore_eos=True)

    def make(name: str) -> Request:
        return Request(RequestId(name), tuple(prefix + [rng.randrange(256) for _ in range(args.suffix)]), params)

    requests = [make(f"r{i}") for i in range(args.requests)]
    cached = serve_one_by_one(model, source.identity(), True, requests, make("warm-cached"))
    uncached = serve_one_by_one(model, source.identity(), False, requests, make("warm-uncached"))
    assert all(c.output_token_ids == u.output_token_ids for c, u in zip(cached, uncached, strict=True))
    assert all(c.stats.sources is not None and c.stats.sources.local_gpu == args.prefix for c in cached)

    ttft_cached = statistics.median(o.stats.ttft_s or 0.0 for o in cached)
    ttft_uncached = statistics.median(o.stats.ttft_s or 0.0 for o in uncached)
    prefill_rate = sum(o.stats.prompt_tokens for o in uncached) / sum(o.stats.ttft_s or 0.0 for o in uncached)
    print(f"model={args.model} threads={args.threads} requests={args.requests} "
          f"prompt={args.prefix}+{args.suffix} tokens")
    print(f"median TTFT cached prefix: {ttft_cached * 1e3:.1f} ms   caching off: {ttft_uncached * 1e3:.1f} ms")
    print(f"prefill throughput (caching off): {prefill_rate:.0f} tokens/s   outputs identical: yes")
    result: dict[str, object] = {
        "ttft_cached_s": round(ttft_cached, 6),
        "ttft_uncached_s": round(ttft_uncached, 6),
        "ratio_cached_vs_uncached": round(ttft_cached / ttft_uncached, 4),
        "prefill_tokens_per_s": round(prefill_rate, 1),
        "model": args.model,
    }
    if args.smoke:
        result["smoke"] = True
    result_file = args.out / ("engine_ttft.json" if args.model == DEFAULT_MODEL else f"engine_ttft_{source.name}.json")
    result_file.parent.mkdir(parents=True, exist_ok=True)
    result_file.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
