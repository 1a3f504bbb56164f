"""Calibrate a CPU profile of the modeled engine on this machine: time the real engine's forward at the
shapes the time model prices, and fit the profile's figures (node_agent/model/modeled/time_model.py).

    python bench/modeled_calibrate.py [--model smollm2-135m-instruct] [--trials 3]

One torch thread, as an agent actor gets; the CPU time of the thread running the model's forward only,
medians over `--trials`. Prints the raw timings, the fitted figures and one JSON line. The timing and
the fit: docs/benchmarks.md#benchmodeled_calibratepy.
"""

import argparse
import json
import random
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from radixmesh.node_agent.engine.config import EngineConfig
from radixmesh.node_agent.engine.engine import Engine
from radixmesh.node_agent.engine.request import Request, RequestId
from radixmesh.node_agent.memory.config import MemoryConfig
from radixmesh.node_agent.model.base import CausalLM
from radixmesh.node_agent.model.llama import AttentionBatch
from radixmesh.node_agent.model.source import SMOLLM2, resolve_model
from radixmesh.proto.serve.sampling import SamplingParams

RESULTS = Path(__file__).parent / "results"
PREFILLS = ((128, 0), (256, 0), (512, 0), (256, 512), (512, 512), (512, 1024))
"""(new tokens, cached context) of the timed prefill forwards."""
DECODES = ((1, 128), (1, 1024), (4, 128), (8, 128), (8, 512), (16, 128), (32, 128))
"""(batch, context) of the timed decode forwards."""
SMOKE_PREFILLS = ((16, 0), (32, 0), (32, 32))
SMOKE_DECODES = ((1, 16), (2, 16), (2, 32))


class Timed:
    """Wraps a model: records the CPU seconds of each forward (one torch thread: this thread's)."""

    def __init__(self, model: CausalLM) -> None:
        self.model = model
        self.config = model.config
        self.seconds: list[float] = []

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        return self.model.parameters()

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, batch: AttentionBatch,
                 kv_cache: torch.Tensor, logits_indices: torch.Tensor) -> torch.Tensor:
        t0 = time.thread_time()
        out = self.model(input_ids, positions, batch, kv_cache, logits_indices)
        self.seconds.append(time.thread_time() - t0)
        return out


def _prompt(rng: random.Random, n: int) -> tuple[int, ...]:
    return tuple(rng.randrange(256) for _ in range(n))


def time_prefill(engine: Engine, timed: Timed, rng: random.Random, new: int, cached: int) -> float:
    """One forward of `new` prompt tokens after `cached` tokens this engine holds already."""
    prefix = _prompt(rng, cached)
    params = SamplingParams(max_tokens=1, ignore_eos=True)
    if cached:
        engine.generate([Request(RequestId(f"warm-{rng.random()}"), prefix + (1,) * 16, params)])
    req = Request(RequestId(f"p-{rng.random()}"), prefix + _prompt(rng, new), params)
    engine.submit(req)
    timed.seconds.clear()
    while engine.has_work:
        engine.step()
    return timed.seconds[0]


def time_decode(engine: Engine, timed: Timed, rng: random.Random, batch: int, context: int) -> float:
    """Median forward of decode-only steps of `batch` sequences near `context` tokens."""
    # Long enough that the first sequence still decodes once the last one's prefill is done.
    params = SamplingParams(max_tokens=batch * context // engine.config.max_num_batched_tokens + 6, ignore_eos=True)
    reqs = [Request(RequestId(f"d-{rng.random()}"), _prompt(rng, context), params) for _ in range(batch)]
    for r in reqs:
        engine.submit(r)
    times: list[float] = []
    while engine.has_work:
        timed.seconds.clear()
        running = len(engine.scheduler.running)
        waiting = len(engine.scheduler.waiting)
        computed = engine.counters.computed_tokens
        engine.step()
        if not waiting and engine.counters.computed_tokens - computed == running == batch and timed.seconds:
            times.append(timed.seconds[0])
    if not times:
        raise RuntimeError(f"no decode-only step of batch {batch} at context {context}")
    return statistics.median(times)


def _lstsq(rows: list[list[float]], ys: list[float]) -> list[float]:
    x = torch.tensor(rows, dtype=torch.float64)
    y = torch.tensor(ys, dtype=torch.float64).unsqueeze(1)
    return [float(v) for v in torch.linalg.lstsq(x, y).solution.squeeze(1)]


def fit_figures(prefill: dict[tuple[int, int], float], decode: dict[tuple[int, int], float]) -> dict[str, float]:
    """The profile's figures fitted to the timings (module docstring), least squares of relative errors
    (a 60 ms decode matters as much as a 2 s prefill)."""
    base, linear, attention = (max(v, 0.0) for v in _lstsq(
        [[1.0 / t, n / t, n * (c + (n + 1) / 2) / t] for (n, c), t in prefill.items()], [1.0] * len(prefill)))
    best: tuple[float, float, float, float] | None = None
    for i in range(1, int(max(decode.values()) / 5e-4) + 1):
        floor = i * 5e-4
        rest = {(b, c): t - max(floor, linear * b) for (b, c), t in decode.items()}
        per_seq, kv_read = (max(v, 0.0) for v in _lstsq(
            [[b / decode[b, c], b * c / decode[b, c]] for b, c in rest], [r / decode[k] for k, r in rest.items()]))
        err = sum(((r - per_seq * b - kv_read * b * c) / decode[b, c]) ** 2 for (b, c), r in rest.items())
        if best is None or err < best[0]:
            best = (err, floor, per_seq, kv_read)
    assert best is not None
    _, floor, per_seq, kv_read = best
    return {"step_overhead_s": 0.0, "weights_read_s": floor, "linear_base_s": base, "linear_s_per_token": linear,
            "attention_s_per_token_pair": attention, "decode_s_per_seq": per_seq, "kv_read_s_per_token": kv_read}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=SMOLLM2)
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--out", type=Path, default=RESULTS, help="folder for modeled_calibrate.json")
    p.add_argument("--smoke", action="store_true", help="tiny model, small shapes, one trial")
    args = p.parse_args()
    prefills, decodes = (SMOKE_PREFILLS, SMOKE_DECODES) if args.smoke else (PREFILLS, DECODES)
    if args.smoke:
        args.model, args.trials = "random-tiny", 1
    torch.set_num_threads(1)
    source = resolve_model(args.model)
    model = source.load()
    config = EngineConfig(model_id=source.identity(), memory=MemoryConfig(num_gpu_blocks=4096))
    engine = Engine(model, config)
    timed = Timed(engine.model)
    engine.model = timed  # the forward is all the engine calls of its model
    rng = random.Random(0)
    time_prefill(engine, timed, rng, 64, 0)  # warm-up
    prefill = {s: statistics.median(time_prefill(engine, timed, rng, *s) for _ in range(args.trials))
               for s in prefills}
    decode = {s: statistics.median(time_decode(engine, timed, rng, *s) for _ in range(args.trials))
              for s in decodes}
    for (n, c), t in prefill.items():
        print(f"prefill {n:5d} new after {c:5d} cached: {t * 1e3:8.2f} ms  ({n / t:7.0f} tokens/s)")
    for (b, c), t in decode.items():
        print(f"decode  batch {b:3d} context {c:5d}:        {t * 1e3:8.2f} ms")
    fit = fit_figures(prefill, decode)
    for name, value in fit.items():
        print(f"{name:28s} {value:.4g}")
    result = {"model": args.model, "threads": 1, "trials": args.trials, "clock": "thread CPU time",
              "prefill_ms": {f"{n}+{c}": round(t * 1e3, 3) for (n, c), t in prefill.items()},
              "decode_ms": {f"b{b}@{c}": round(t * 1e3, 3) for (b, c), t in decode.items()},
              "fit": {k: float(f"{v:.4g}") for k, v in fit.items()}}
    if args.smoke:
        result["smoke"] = True
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "modeled_calibrate.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
