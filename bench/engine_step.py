"""Engine step on CPU: paged decode attention against dense SDPA, and engine tokens/s with one mixed
forward per step against the old prefill-forward-then-decode-forward step.

    python bench/engine_step.py --before /tmp/before

`--before PATH` adds that checkout's torch reference and engine (e.g. `git worktree add /tmp/before
HEAD`). Prints tables, then ONE JSON line, also written to DIR/engine_step.json (--out DIR, default
bench/results). `--smoke` runs both parts at tiny sizes, the engine on the tiny model. What the two
parts measure and how: docs/benchmarks.md#benchengine_steppy.
"""

import argparse
import importlib.util
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from radixmesh.kernels import ops as kernels
from radixmesh.node_agent.engine.config import EngineConfig
from radixmesh.node_agent.engine.engine import Engine, StepOutput
from radixmesh.node_agent.engine.request import Request, RequestId
from radixmesh.node_agent.memory.config import MemoryConfig
from radixmesh.node_agent.model.llama import LlamaForCausalLM
from radixmesh.node_agent.model.source import SMOLLM2, resolve_model
from radixmesh.proto.serve.sampling import SamplingParams

RESULTS = Path(__file__).parent / "results"
HEADS, KV_HEADS, HEAD_DIM, BLOCK, LAYERS = 9, 3, 64, 16, 30
SMOKE = {"model": "random-tiny", "batches": [1, 2], "attention_batches": [1, 2], "context": 64, "prompt": 32,
         "max_tokens": 4, "trials": 1, "repeats": 5}


def paired_ms(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[float]]:
    """CPU ms of each call, the calls interleaved (a, b, c, a, b, c, ...) after five warm-up rounds, so
    each round's figures saw the same load on the shared cores; process time, not wall time, so a
    call that was descheduled is not charged for it."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for i in range(repeats + 5):
        for name, fn in fns.items():
            start = time.process_time()
            fn()
            if i >= 5:
                times[name].append((time.process_time() - start) * 1e3)
    return times


def load_file(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def attention(batch: int, context: int, repeats: int, before: Path | None) -> dict[str, float]:
    """Per-layer ms of paged decode attention (this checkout's, `before`'s) and of dense SDPA."""
    gen = torch.Generator().manual_seed(batch)
    per_seq = -(-(context + 1) // BLOCK)
    pool = torch.randn((batch * per_seq + 8, LAYERS, 2, BLOCK, KV_HEADS, HEAD_DIM), generator=gen)
    tables = torch.randperm(pool.shape[0], generator=gen)[: batch * per_seq].view(batch, per_seq).int()
    cache_k, cache_v = pool[:, LAYERS // 2, 0], pool[:, LAYERS // 2, 1]
    dense_k = cache_k[tables.long()].reshape(batch, -1, KV_HEADS, HEAD_DIM)[:, :context].transpose(1, 2).contiguous()
    dense_v = cache_v[tables.long()].reshape(batch, -1, KV_HEADS, HEAD_DIM)[:, :context].transpose(1, 2).contiguous()
    q = torch.randn((batch, HEADS, HEAD_DIM), generator=gen)
    lens = torch.full((batch,), context, dtype=torch.int32)
    scale = 1 / math.sqrt(HEAD_DIM)

    def dense() -> torch.Tensor:
        return F.scaled_dot_product_attention(q[:, :, None], dense_k, dense_v, scale=scale, enable_gqa=True)[:, :, 0]

    plan = kernels.plan_decode(tables, lens, cache_k, HEADS)
    calls: dict[str, Callable[[], object]] = {
        "dense_sdpa": dense,
        "paged": lambda: kernels.paged_decode_attention(q, cache_k, cache_v, plan, scale),
        "plan": lambda: kernels.plan_decode(tables, lens, cache_k, HEADS),
    }
    if before is not None:
        old = load_file(before / "kernels" / "decode_attention.py", "before_decode_attention")
        calls["before_paged"] = lambda: old.paged_decode_attention_torch(q, cache_k, cache_v, tables, lens, scale)
    want = dense()
    for name in ("paged", "before_paged"):
        if name in calls:
            torch.testing.assert_close(calls[name](), want, atol=1e-5, rtol=1e-5)
    times = paired_ms(calls, repeats)
    # The plan is made once per forward and read by every layer: 1/LAYERS of it is each layer's share.
    paged = [t + p / LAYERS for t, p in zip(times["paged"], times.pop("plan"), strict=True)]
    times["paged"] = paged
    out = {f"{name}_ms": statistics.median(ts) for name, ts in times.items()}
    out["ratio_paged_vs_dense"] = statistics.median(p / d for p, d in zip(paged, times["dense_sdpa"], strict=True))
    if "before_paged" in times:
        out["ratio_before_vs_dense"] = statistics.median(
            p / d for p, d in zip(times["before_paged"], times["dense_sdpa"], strict=True))
    return out


class TwoForwardEngine(Engine):
    """The step as it was: a forward over the prefill chunks, then one over the decodes (benchmark only)."""

    def step(self) -> StepOutput:
        plan = self.scheduler.schedule()
        self.counters.steps += 1
        out = StepOutput([], [])
        for group in ([c for c in plan if c.num_tokens > 1], [c for c in plan if c.num_tokens == 1]):
            if group:
                self._run(group, out)
        return out


class Served(NamedTuple):
    """One closed-loop run: generated tokens per wall second and per CPU second, and the outputs."""

    wall_rate: float
    cpu_rate: float
    outputs: list[list[int]]


def closed_loop(engine: Engine, batch: int, prompt_len: int, max_tokens: int) -> Served:
    """Serve 2 * `batch` requests keeping `batch` in flight."""
    rng = random.Random(batch)
    requests = [Request(RequestId(f"r{i}"), tuple(rng.randrange(256) for _ in range(prompt_len)),
                        SamplingParams(max_tokens=max_tokens // 2 + i * 7 % max_tokens, ignore_eos=True))
                for i in range(2 * batch)]
    outputs: dict[str, list[int]] = {}
    queued = iter(requests)
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(batch):
        engine.submit(next(queued))
    while engine.has_work:
        for rid, token, _ in (step := engine.step()).tokens:
            outputs.setdefault(rid, []).append(token)
        for _ in step.finished:
            if (nxt := next(queued, None)) is not None:
                engine.submit(nxt)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    tokens = sum(map(len, outputs.values()))
    return Served(tokens / wall, tokens / cpu, [outputs[r.request_id] for r in requests])


def serve(model: LlamaForCausalLM, model_id: str, two_forwards: bool, batch: int, args: argparse.Namespace) -> Served:
    memory = MemoryConfig(num_gpu_blocks=1024, enable_prefix_caching=False)
    engine = (TwoForwardEngine if two_forwards else Engine)(model, EngineConfig(model_id=model_id, memory=memory))
    return closed_loop(engine, batch, args.prompt, args.max_tokens)


def serve_before(before: Path, batch: int, args: argparse.Namespace) -> Served:
    """The `before` checkout's Engine as it is, in a subprocess importing radixmesh from there."""
    cmd = [sys.executable, __file__, "--engine-json", "--batches", str(batch), "--prompt", str(args.prompt),
           "--max-tokens", str(args.max_tokens), "--threads", str(args.threads), "--model", args.model]
    done = subprocess.run(cmd, env={**os.environ, "PYTHONPATH": str(before)}, capture_output=True, text=True,
                          check=True)
    return Served(*json.loads(done.stdout.splitlines()[-1]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, nargs="+", default=None, help="engine batches (default 1 8 32)")
    p.add_argument("--attention-batches", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--context", type=int, default=350)
    p.add_argument("--prompt", type=int, default=128, help="prompt tokens per request")
    p.add_argument("--max-tokens", type=int, default=32, help="output tokens, staggered from half to 1.5x")
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--repeats", type=int, default=200, help="timed calls per attention figure")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: steady on shared cores)")
    p.add_argument("--before", type=Path, default=None, help="a checkout to measure as the baseline")
    p.add_argument("--model", default=SMOLLM2, help="model SPEC of the engine part (see radixmesh up --help)")
    p.add_argument("--out", type=Path, default=RESULTS, help="folder for engine_step.json")
    p.add_argument("--smoke", action="store_true", help=f"tiny run: {SMOKE}")
    p.add_argument("--engine-json", action="store_true", help=argparse.SUPPRESS)  # the --before subprocess
    a = p.parse_args()
    if a.smoke:  # smaller defaults; sizes given on the command line still win
        p.set_defaults(**SMOKE)
        a = p.parse_args()
    torch.set_num_threads(a.threads)
    batches = a.batches or [1, 8, 32]
    source = resolve_model(a.model)
    model = source.load()
    if a.engine_json:
        print(json.dumps(serve(model, source.identity(), False, batches[0], a)))
        return

    attn: dict[int, list[dict[str, float]]] = {}
    for _ in range(a.trials):
        for b in a.attention_batches:
            attn.setdefault(b, []).append(attention(b, a.context, a.repeats, a.before))
    variants = ["mixed", "two_forwards"] + (["before"] if a.before else [])
    runs: dict[str, dict[int, list[Served]]] = {v: {b: [] for b in batches} for v in variants}
    for _ in range(a.trials):
        for b in batches:  # interleaved, so each variant meets the same load on the shared cores
            runs["mixed"][b].append(serve(model, source.identity(), False, b, a))
            runs["two_forwards"][b].append(serve(model, source.identity(), True, b, a))
            if a.before:
                runs["before"][b].append(serve_before(a.before, b, a))
    for v, by_batch in runs.items():
        for b, served in by_batch.items():
            assert all(s.outputs == runs["mixed"][b][0].outputs for s in served), f"{v} batch {b}: outputs differ"

    def med(values: list[float]) -> float:
        return round(statistics.median(values), 4)

    result: dict[str, Any] = {
        "bench": "engine_step",
        "threads": a.threads,
        "trials": a.trials,
        "attention": {"shape": {"heads": HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM, "block_size": BLOCK,
                                "context": a.context, "layers": LAYERS, "dtype": "float32"},
                      "per_layer_ms": {b: {k: med([t[k] for t in ts]) for k in ts[0]} for b, ts in attn.items()}},
        "engine": {"model": a.model, "prompt": a.prompt, "max_tokens": a.max_tokens, "requests": "2 x batch",
                   "tokens_per_s": {v: {b: med([s.wall_rate for s in ss]) for b, ss in by_b.items()}
                                    for v, by_b in runs.items()},
                   "tokens_per_cpu_s": {v: {b: med([s.cpu_rate for s in ss]) for b, ss in by_b.items()}
                                        for v, by_b in runs.items()},
                   "outputs_identical": True},
    }
    if a.smoke:
        result["smoke"] = True
    print_tables(result)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "engine_step.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


def print_tables(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=160)
    attn = Table(title=f"decode attention, ms per layer (medians of {result['trials']} trials, "
                       f"{result['threads']} thread, context {result['attention']['shape']['context']})")
    for col in ("batch", "dense SDPA", "paged (now)", "ratio now", "paged (before)", "ratio before"):
        attn.add_column(col, justify="right")
    for b, f in result["attention"]["per_layer_ms"].items():
        attn.add_row(str(b), f"{f['dense_sdpa_ms']:.3f}", f"{f['paged_ms']:.3f}", f"{f['ratio_paged_vs_dense']:.2f}x",
                     f"{f.get('before_paged_ms', float('nan')):.3f}", f"{f.get('ratio_before_vs_dense', float('nan')):.2f}x")
    console.print(attn)
    for key, what in (("tokens_per_s", "tokens/s"), ("tokens_per_cpu_s", "tokens per CPU second")):
        tps = result["engine"][key]
        eng = Table(title=f"engine {what}, {result['engine']['model']} (medians of {result['trials']} interleaved "
                          "trials; closed loop of `batch` requests in flight)")
        for col in ("batch", *tps, "mixed / two forwards", *(["mixed / before"] if "before" in tps else [])):
            eng.add_column(col, justify="right")
        for b in tps["mixed"]:
            row = [str(b), *(f"{tps[v][b]:.1f}" for v in tps), f"{tps['mixed'][b] / tps['two_forwards'][b]:.2f}x"]
            if "before" in tps:
                row.append(f"{tps['mixed'][b] / tps['before'][b]:.2f}x")
            eng.add_row(*row)
        console.print(eng)


if __name__ == "__main__":
    main()
