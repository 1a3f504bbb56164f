"""The engine step of bench/gpu_check.py: the node engine serving a seeded random Llama-3-8B (bf16, CUDA).

  decode   `batch` requests (1, 16, 64) decoding together: generated tokens per second over timed steps
           in which every one of them decodes (prefills done, kernels compiled);
  ttft     a 1k- and a 4k-token prompt served cold (nothing cached), then again warm (the prefix from
           this engine's gpu cache): TTFT of each, from the engine's own clock;
  greedy   the cold and warm outputs of each prompt agree token for token. bf16 GEMMs over different
           row counts round differently, so a near-tie may flip: a differing token counts as agreement
           only when the cold run's top two logits there were within `logit_tolerance` and the logits
           before it were too (a wrong cached K/V moves them by far more).
A smoke run does the same with the tiny model in float32 on the CPU. Imports the engine and the model
only: torch, numpy and the four small modules the engine's own imports bring (docs/gpu_check.md).
"""

import gc
import math
import random
import statistics
import time
from dataclasses import dataclass, replace
from typing import NamedTuple

import torch
from gpu_step import StepLog

from radixmesh.node_agent.engine.config import EngineConfig
from radixmesh.node_agent.engine.engine import Engine
from radixmesh.node_agent.engine.request import Request, RequestId, RequestOutput
from radixmesh.node_agent.memory.config import MemoryConfig
from radixmesh.node_agent.model.config import LlamaConfig, named_config
from radixmesh.node_agent.model.llama import LlamaForCausalLM
from radixmesh.proto.serve.limits import usable_prefix_blocks
from radixmesh.proto.serve.sampling import SamplingParams

GIB = 1 << 30


@dataclass(frozen=True, slots=True)
class EnginePlan:
    """What the engine step serves, and how much of it."""

    model: str
    """A named config (node_agent/model/config.py) with seeded random weights."""
    dtype: torch.dtype
    num_blocks: int
    """KV pool size in blocks of 16 tokens."""
    max_num_batched_tokens: int
    """Token budget of one engine step (prefill chunk size)."""
    decode_batches: tuple[int, ...]
    decode_prompt: int
    """Prompt tokens of each decode request."""
    decode_steps: int
    """Timed steps per batch (after an untimed pass of as many)."""
    ttft_prompts: tuple[int, ...]
    trials: int
    """Cold/warm pairs per prompt length, after one untimed pair."""
    greedy_tokens: int
    """Tokens generated per TTFT request, compared cold vs warm."""
    logit_tolerance: float

    def quick(self) -> "EnginePlan":
        return replace(self, decode_steps=max(4, self.decode_steps // 2), trials=max(1, self.trials - 1))


# 4096 blocks: 8 GiB of bf16 KV at Llama-3-8B shapes (128 KiB a token), beside 16 GiB of weights.
GPU_PLAN = EnginePlan("llama3-8b", torch.bfloat16, num_blocks=4096, max_num_batched_tokens=2048,
                      decode_batches=(1, 16, 64), decode_prompt=128, decode_steps=32, ttft_prompts=(1024, 4096),
                      trials=3, greedy_tokens=16, logit_tolerance=0.5)
SMOKE_PLAN = EnginePlan("tiny", torch.float32, num_blocks=256, max_num_batched_tokens=256, decode_batches=(1, 4),
                        decode_prompt=32, decode_steps=4, ttft_prompts=(64, 256), trials=1, greedy_tokens=4,
                        logit_tolerance=1e-3)


def seeded_model(config: LlamaConfig, seed: int, dtype: torch.dtype, device: torch.device) -> LlamaForCausalLM:
    """random_model's distributions (embeddings N(0, 1), linears N(0, 1/fan_in), norms 1), drawn on `device`
    in `dtype`: random_model draws float32 on the CPU, which at 8B parameters takes 32 GiB of host memory
    and minutes. Built on the meta device, so nothing is initialised twice."""
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model = model.to(dtype=dtype).to_empty(device=device)
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            elif name.endswith("embed_tokens.weight"):
                param.normal_(0.0, 1.0, generator=gen)
            else:
                param.normal_(0.0, 1 / math.sqrt(param.shape[-1]), generator=gen)
    return model.eval()


class Agreement(NamedTuple):
    """How the greedy tokens of a warm run compare with the cold run of the same prompt."""

    identical: bool
    first_divergence: int | None
    max_logit_diff: float
    """Over the positions up to the first divergence (same history, so comparable)."""
    margin: float | None
    """At the first divergence: the cold logit of the cold token minus that of the warm token."""

    def within(self, tolerance: float) -> bool:
        return self.max_logit_diff <= tolerance and (self.margin is None or self.margin <= tolerance)


def agreement(cold: RequestOutput, warm: RequestOutput) -> Agreement:
    assert cold.logits is not None and warm.logits is not None, "the engine keeps logits (keep_logits)"
    pairs = list(zip(cold.output_token_ids, warm.output_token_ids, strict=True))
    first = next((i for i, (a, b) in enumerate(pairs) if a != b), None)
    upto = len(pairs) if first is None else first + 1
    diff = max(float((a - b).abs().max()) for a, b in zip(cold.logits[:upto], warm.logits[:upto], strict=True))
    margin = None
    if first is not None:
        logits = cold.logits[first]
        margin = float(logits[pairs[first][0]] - logits[pairs[first][1]])
    return Agreement(first is None, first, diff, margin)


class EngineBench:
    """The model and the engines built on it, one measurement at a time."""

    def __init__(self, plan: EnginePlan, device: torch.device, seed: int, log: StepLog) -> None:
        self.plan, self.device, self.log = plan, device, log
        self.config = named_config(plan.model)
        self.model = seeded_model(self.config, seed, plan.dtype, device)
        self.rng = random.Random(seed)

    def engine(self, keep_logits: bool) -> Engine:
        p = self.plan
        config = EngineConfig(model_id=f"gpu-check-{p.model}", max_num_batched_tokens=p.max_num_batched_tokens,
                              keep_logits=keep_logits, memory=MemoryConfig(num_gpu_blocks=p.num_blocks))
        return Engine(self.model, config, device=self.device, clock=time.perf_counter)

    def prompt(self, n: int) -> tuple[int, ...]:
        """Random tokens: no two prompts share a first block, so only a repeat hits the cache."""
        return tuple(self.rng.randrange(self.config.vocab_size) for _ in range(n))

    def decode(self, engine: Engine, batch: int) -> None:
        # Twice, timing the second: the decode kernel's launch constants follow the table width, so the
        # first pass compiles every variant that the timed one meets at the same lengths.
        self.decode_pass(engine, batch, "warmup")
        elapsed = self.decode_pass(engine, batch, "timed")
        steps = self.plan.decode_steps
        self.log.record("decode", batch=batch, steps=steps, tokens_per_s=round(batch * steps / elapsed, 1),
                        step_ms=round(elapsed / steps * 1e3, 2))

    def decode_pass(self, engine: Engine, batch: int, tag: str) -> float:
        """Seconds of `decode_steps` engine steps in which all `batch` requests decode."""
        p = self.plan
        params = SamplingParams(max_tokens=p.decode_steps + 64, ignore_eos=True)
        ids = [RequestId(f"decode-{batch}-{tag}-{i}") for i in range(batch)]
        for rid in ids:
            engine.submit(Request(rid, self.prompt(p.decode_prompt), params))
        started: set[str] = set()
        while len(started) < batch:  # until every prefill is done
            started |= {rid for rid, _, _ in engine.step().tokens}
        start = time.perf_counter()
        for _ in range(p.decode_steps):
            step = engine.step()
            assert len(step.tokens) == batch and not step.finished, "every request decodes in every timed step"
        elapsed = time.perf_counter() - start
        for rid in ids:
            engine.abort(rid)
        engine.check_invariants()
        return elapsed

    def ttft(self, engine: Engine, length: int, trial: int | None) -> None:
        """A cold then a warm serve of one fresh prompt; `trial` None is the untimed warm-up pair."""
        params = SamplingParams(max_tokens=self.plan.greedy_tokens, ignore_eos=True)
        prompt = self.prompt(length)
        tag = "warmup" if trial is None else str(trial)
        cold, warm = (engine.generate([Request(RequestId(f"{kind}-{length}-{tag}"), prompt, params)])[0]
                      for kind in ("cold", "warm"))
        engine.check_invariants()
        if trial is None:
            return
        assert cold.stats.sources is not None and warm.stats.sources is not None
        cold_hit, warm_hit = cold.stats.sources.local_gpu, warm.stats.sources.local_gpu
        # The warm serve must find every block but the one holding the last token (usable_prefix_blocks).
        hit_ok = cold_hit == 0 and warm_hit == usable_prefix_blocks(length, engine.layout.block_size) * (
            engine.layout.block_size)
        agree = agreement(cold, warm)
        self.log.record("ttft", hit_ok and agree.within(self.plan.logit_tolerance), prompt=length, trial=trial,
                        cold_s=round(cold.stats.ttft_s or 0.0, 5), warm_s=round(warm.stats.ttft_s or 0.0, 5),
                        cold_hit=cold_hit, warm_hit=warm_hit, identical=agree.identical,
                        first_divergence=agree.first_divergence, max_logit_diff=round(agree.max_logit_diff, 5),
                        margin=None if agree.margin is None else round(agree.margin, 5))

    def decode_rates(self) -> None:
        engine = self.engine(keep_logits=False)
        for batch in self.plan.decode_batches:
            self.decode(engine, batch)

    def ttfts(self) -> None:
        engine = self.engine(keep_logits=True)  # the logits behind any differing greedy token
        for length in self.plan.ttft_prompts:
            self.ttft(engine, length, None)
            for trial in range(self.plan.trials):
                self.ttft(engine, length, trial)


def run(plan: EnginePlan, device: torch.device, seed: int, log: StepLog) -> dict[str, object]:
    """Decode rates, then TTFT and greedy agreement, into `log`; returns their medians and verdicts."""
    start = time.perf_counter()
    bench = EngineBench(plan, device, seed, log)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    weights = sum(p.numel() * p.element_size() for p in bench.model.parameters())
    log.summary.update(device=name, model=plan.model, dtype=str(plan.dtype), weights_gib=round(weights / GIB, 3),
                       load_s=round(time.perf_counter() - start, 2))
    bench.decode_rates()
    gc.collect()  # the decode engine's pool goes back before the next engine takes as much
    if device.type == "cuda":
        torch.cuda.empty_cache()
    bench.ttfts()
    return summarize(log.rows)


def summarize(rows: list[dict[str, object]]) -> dict[str, object]:
    def figure(row: dict[str, object], key: str) -> float:
        value = row[key]
        assert isinstance(value, float | int), (key, value)
        return float(value)

    ttft: dict[str, dict[str, float]] = {}
    for length in sorted({int(figure(r, "prompt")) for r in rows if r["kind"] == "ttft"}):
        mine = [r for r in rows if r["kind"] == "ttft" and r["prompt"] == length]
        cold = statistics.median(figure(r, "cold_s") for r in mine)
        warm = statistics.median(figure(r, "warm_s") for r in mine)
        ttft[str(length)] = {"cold_s": round(cold, 5), "warm_s": round(warm, 5),
                             "warm_over_cold": round(warm / cold, 4) if cold else 0.0}
    greedy = [r for r in rows if r["kind"] == "ttft"]
    return {"decode_tokens_per_s": {str(r["batch"]): r["tokens_per_s"] for r in rows if r["kind"] == "decode"},
            "ttft": ttft, "outputs_identical": all(r["identical"] for r in greedy),
            "outputs_agree": all(r["ok"] for r in greedy)}
