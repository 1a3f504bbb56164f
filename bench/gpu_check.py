"""GPU check for a lent device: every Triton kernel against its torch reference, then timings.

One script, Llama-3-8B attention shapes (32 query heads, 8 KV heads, head_dim 128, block 16, bf16):
  1. correctness: write_kv / gather / scatter exactly equal; paged decode (batch 1-256, context up to
     32k, random non-contiguous tables, shared prefix blocks, ragged lengths) and paged prefill within
     bf16 tolerance of the torch reference;
  2. `triton.testing.do_bench` medians, every baseline measured in the same run: paged decode bandwidth
     as a fraction of a device-to-device copy (goal >= 0.7) and its time vs SDPA on the same K/V laid
     out contiguously (goal <= 1.3x); prefill over a paged prefix vs SDPA; gather/scatter bandwidth vs
     the copy (goal >= 0.8);
  3. a real model served by a 2-agent cluster on this one GPU (bench/gpu_cluster.py): TTFT cached vs
     uncached, decode tokens/s, agent-to-agent pull GB/s vs a device copy, identical outputs.
Prints a table, then one JSON line, also written to bench/results/gpu_check.json. Exits 2 without
CUDA, 1 when a correctness check fails.

    python bench/gpu_check.py [--quick]
"""

import argparse
import json
import math
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
import triton.testing
from torch.nn.attention.bias import causal_lower_right

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling gpu_cluster, run as a script
import gpu_cluster

RESULT = Path(__file__).parent / "results" / "gpu_check.json"
GIB = 1 << 30


@dataclass(frozen=True, slots=True)
class ModelShape:
    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    block_size: int = 16
    pool_layers: int = 4
    """Layers in the attention pool: enough for the real strided per-layer views, few enough to fit."""
    copy_layers: int = 32
    """Layers in the gather/scatter pool: a real Llama-3-8B block (2 MiB in bf16)."""


LLAMA3_8B = ModelShape()
# (batch, context): correctness with ragged lengths in [context / 2, context].
DECODE_CHECKS = [(1, 32768), (16, 4096), (64, 2048), (256, 512)]
# (batch, context): timing with uniform lengths, so SDPA sees the same work without a mask.
DECODE_BENCH = [(1, 512), (1, 32768), (8, 8192), (32, 4096), (64, 4096), (128, 2048), (256, 512), (256, 4096)]
# (batch, cached prefix, new tokens) per sequence.
PREFILL_CHECKS = [(1, 0, 512), (4, 1000, 300), (2, 8192, 1024)]
PREFILL_BENCH = [(1, 4096, 512), (4, 8192, 1024), (1, 30720, 2048)]
COPY_BLOCKS = 512  # 1 GiB of Llama-3-8B blocks per gather/scatter
BANDWIDTH_BOUND_BYTES = 256 << 20
"""Decode cases reading at least this much K/V are the ones held to the bandwidth goal."""


def pool_tokens(shape: ModelShape = LLAMA3_8B) -> int:
    """Tokens the shared attention pool must hold: the largest case of any table, plus slack."""
    decode = max(b * c for b, c in DECODE_CHECKS + DECODE_BENCH)
    prefill = max(b * (p + n) for b, p, n in PREFILL_CHECKS + PREFILL_BENCH)
    return max(decode, prefill) + 64 * shape.block_size


def planned_bytes(shape: ModelShape = LLAMA3_8B) -> int:
    """Device memory the check allocates at its peak (pool, a contiguous K/V copy for SDPA, copies)."""
    token_bytes = shape.kv_heads * shape.head_dim * 2 * 2  # K and V, bf16
    pool = pool_tokens(shape) * shape.pool_layers * token_bytes
    dense = max(b * c for b, c in DECODE_BENCH) * token_bytes
    block = shape.copy_layers * shape.block_size * token_bytes
    copies = (2 * COPY_BLOCKS) * block + 2 * GIB
    return pool + 2 * dense + copies


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Triton kernels on a GPU: correctness, then timings.")
    p.add_argument("--quick", action="store_true", help="fewer timing cases (correctness unchanged)")
    p.add_argument("--out", type=Path, default=RESULT, help="where to write the JSON result")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", default="smollm2-135m-instruct", help="model of the cluster check")
    p.add_argument("--no-cluster", action="store_true", help="kernels only")
    return p.parse_args(argv)


def _median_ms(fn: Callable[[], object]) -> float:
    return float(triton.testing.do_bench(fn, return_mode="median"))


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
          mask: torch.Tensor | None = None) -> torch.Tensor:
    """SDPA with native GQA; where a backend refuses it, on K/V expanded to every query head."""
    try:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
    except (RuntimeError, NotImplementedError, ValueError):
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


@dataclass(slots=True)
class Checker:
    """The shared attention pool, the random source and the results gathered so far."""

    shape: ModelShape
    gen: torch.Generator
    kv: torch.Tensor
    copy_gbps: float
    rows: list[dict[str, object]]
    correct: bool = True

    @property
    def caches(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.kv[:, 1, 0], self.kv[:, 1, 1]

    def tables(self, block_counts: list[int], shared: int) -> torch.Tensor:
        """Random non-contiguous tables; the first `shared` blocks are common to every sequence."""
        perm = torch.randperm(self.kv.shape[0], generator=self.gen)
        rows = torch.zeros((len(block_counts), max(block_counts) + 1), dtype=torch.int32)
        used = shared
        for b, n in enumerate(block_counts):
            rows[b, :shared] = perm[:shared]
            rows[b, shared:n] = perm[used : used + n - shared]
            used += n - shared
        return rows.cuda()

    def record(self, kind: str, ok: bool | None = None, **figures: object) -> None:
        self.correct = self.correct and ok is not False
        self.rows.append({"kind": kind, **({} if ok is None else {"ok": ok}), **figures})
        print(kind, " ".join(f"{k}={v}" for k, v in figures.items()), "" if ok is None else ("OK" if ok else "FAIL"))


def _close(got: torch.Tensor, want: torch.Tensor) -> tuple[bool, float]:
    err = float((got.float() - want.float()).abs().max())
    return bool(torch.isfinite(got).all()) and torch.allclose(got.float(), want.float(), atol=2e-2, rtol=2e-2), err


def check_copies(c: Checker) -> None:
    from radixmesh.kernels.block_copy import gather_blocks_torch
    from radixmesh.kernels.block_copy_triton import gather_blocks_triton, scatter_blocks_triton
    from radixmesh.kernels.kv_write import write_kv_torch
    from radixmesh.kernels.kv_write_triton import write_kv_triton

    s = c.shape
    small = torch.randn((512, 2, 2, s.block_size, s.kv_heads, s.head_dim), generator=c.gen).bfloat16().cuda()
    slots = torch.randperm(512 * s.block_size, generator=c.gen)[:4096].cuda()
    k = torch.randn((4096, s.kv_heads, s.head_dim), device="cuda").bfloat16()
    v = torch.randn_like(k)
    a, b = small.clone(), small.clone()
    write_kv_triton(k, v, a[:, 1, 0], a[:, 1, 1], slots)
    write_kv_torch(k, v, b[:, 1, 0], b[:, 1, 1], slots)
    c.record("write_kv", torch.equal(a, b), tokens=4096)

    pool = torch.randn((2 * COPY_BLOCKS + 16, s.copy_layers, 2, s.block_size, s.kv_heads, s.head_dim),
                       device="cuda").bfloat16()
    ids = torch.randperm(pool.shape[0], generator=c.gen)[:COPY_BLOCKS].tolist()
    run = list(range(8, 8 + COPY_BLOCKS))
    buf = gather_blocks_triton(pool, ids)
    c.record("gather", torch.equal(buf, gather_blocks_torch(pool, ids)), blocks=COPY_BLOCKS)
    target = pool.clone()
    scatter_blocks_triton(buf, target, run)
    c.record("scatter", torch.equal(target[8 : 8 + COPY_BLOCKS], buf), blocks=COPY_BLOCKS)
    moved = 2 * buf.numel() * buf.element_size()
    for name, fn in [("gather_triton_random", lambda: gather_blocks_triton(pool, ids, buf)),
                     ("gather_triton_run", lambda: gather_blocks_triton(pool, run, buf)),
                     ("gather_torch_random", lambda: gather_blocks_torch(pool, ids, buf)),
                     ("scatter_triton_random", lambda: scatter_blocks_triton(buf, target, ids))]:
        gbps = moved / (_median_ms(fn) * 1e-3) / 1e9
        c.record(name, gbps=round(gbps, 1), fraction_of_copy=round(gbps / c.copy_gbps, 3))


def check_decode(c: Checker, bench: list[tuple[int, int]]) -> None:
    from radixmesh.kernels.decode_attention import paged_decode_attention_torch
    from radixmesh.kernels.decode_attention_triton import paged_decode_attention_triton

    s, (ck, cv) = c.shape, c.caches
    scale = 1 / math.sqrt(s.head_dim)
    for batch, ctx in DECODE_CHECKS:
        lens = torch.randint(ctx // 2, ctx + 1, (batch,), generator=c.gen, dtype=torch.int32)
        counts = [-(-int(n) // s.block_size) for n in lens]
        tables = c.tables(counts, shared=min(8, min(counts) // 2))
        q = torch.randn((batch, s.heads, s.head_dim), device="cuda").bfloat16()
        lens = lens.cuda()
        got = paged_decode_attention_triton(q, ck, cv, tables, lens, scale)
        ok, err = _close(got, paged_decode_attention_torch(q, ck, cv, tables, lens, scale))
        c.record("decode_check", ok, batch=batch, context=ctx, max_abs_err=round(err, 5))
    for batch, ctx in bench:
        _decode_bench_case(c, batch, ctx)


def _decode_bench_case(c: Checker, batch: int, ctx: int) -> None:
    from radixmesh.kernels.decode_attention_triton import paged_decode_attention_triton

    s, (ck, cv) = c.shape, c.caches
    scale = 1 / math.sqrt(s.head_dim)
    tables = c.tables([ctx // s.block_size] * batch, shared=0)
    lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
    q = torch.randn((batch, s.heads, s.head_dim), device="cuda").bfloat16()
    out = torch.empty_like(q)
    dense_k = ck[tables[:, :-1].long()].view(batch, ctx, s.kv_heads, s.head_dim).transpose(1, 2).contiguous()
    dense_v = cv[tables[:, :-1].long()].view(batch, ctx, s.kv_heads, s.head_dim).transpose(1, 2).contiguous()
    ok, _ = _close(paged_decode_attention_triton(q, ck, cv, tables, lens, scale, out),
                   _sdpa(q[:, :, None], dense_k, dense_v, scale)[:, :, 0])
    t = _median_ms(lambda: paged_decode_attention_triton(q, ck, cv, tables, lens, scale, out))
    t_sdpa = _median_ms(lambda: _sdpa(q[:, :, None], dense_k, dense_v, scale))
    kv_bytes = 2 * dense_k.numel() * dense_k.element_size()
    gbps = kv_bytes / (t * 1e-3) / 1e9
    c.record("decode_bench", ok, batch=batch, context=ctx, us=round(t * 1e3, 1), sdpa_us=round(t_sdpa * 1e3, 1),
             ratio_vs_sdpa=round(t / t_sdpa, 3), gbps=round(gbps, 1),
             fraction_of_copy=round(gbps / c.copy_gbps, 3), bandwidth_bound=kv_bytes >= BANDWIDTH_BOUND_BYTES)


def check_prefill(c: Checker, bench: list[tuple[int, int, int]]) -> None:
    from radixmesh.kernels.prefill_attention import paged_prefill_attention_torch
    from radixmesh.kernels.prefill_attention_triton import paged_prefill_attention_triton

    s, (ck, cv) = c.shape, c.caches
    scale = 1 / math.sqrt(s.head_dim)

    def inputs(prefixes: list[int], news: list[int]) -> tuple[torch.Tensor, ...]:
        counts = [max(1, -(-p // s.block_size)) for p in prefixes]
        tables = c.tables(counts, shared=min(counts) // 2)
        cu = torch.tensor([0, *torch.tensor(news).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
        q = torch.randn((sum(news), s.heads, s.head_dim), device="cuda").bfloat16()
        k = torch.randn((sum(news), s.kv_heads, s.head_dim), device="cuda").bfloat16()
        return q, k, torch.randn_like(k), tables, torch.tensor(prefixes, dtype=torch.int32, device="cuda"), cu

    for batch, prefix, new in PREFILL_CHECKS:
        prefixes = [int(torch.randint(prefix // 2, prefix + 1, (), generator=c.gen)) for _ in range(batch)]
        news = [int(torch.randint(new // 2, new + 1, (), generator=c.gen)) for _ in range(batch)]
        q, k, v, tables, pl, cu = inputs(prefixes, news)
        got = paged_prefill_attention_triton(q, k, v, ck, cv, tables, pl, cu, scale)
        ok, err = _close(got, paged_prefill_attention_torch(q, k, v, ck, cv, tables, pl, cu, scale))
        c.record("prefill_check", ok, batch=batch, prefix=prefix, new=new, max_abs_err=round(err, 5))
    for batch, prefix, new in bench:
        _prefill_bench_case(c, batch, prefix, new, inputs([prefix] * batch, [new] * batch))


def _prefill_bench_case(c: Checker, batch: int, prefix: int, new: int, args: tuple[torch.Tensor, ...]) -> None:
    from radixmesh.kernels.prefill_attention_triton import paged_prefill_attention_triton

    s, (ck, cv) = c.shape, c.caches
    scale = 1 / math.sqrt(s.head_dim)
    q, k, v, tables, pl, cu = args
    out = torch.empty_like(q)
    blocks = tables[:, : prefix // s.block_size].long()
    # The same K/V contiguous for SDPA: [B, kv_heads, prefix + new, D].
    dk, dv = (torch.cat([cache[blocks].view(batch, prefix, s.kv_heads, s.head_dim),
                         fresh.view(batch, new, s.kv_heads, s.head_dim)], 1).transpose(1, 2).contiguous()
              for cache, fresh in ((ck, k), (cv, v)))
    q4 = q.view(batch, new, s.heads, s.head_dim).transpose(1, 2)
    mask = causal_lower_right(new, prefix + new)
    t = _median_ms(lambda: paged_prefill_attention_triton(q, k, v, ck, cv, tables, pl, cu, scale, out))
    t_sdpa = _median_ms(lambda: _sdpa(q4, dk, dv, scale, mask))
    ok, _ = _close(out, _sdpa(q4, dk, dv, scale, mask).transpose(1, 2).reshape(-1, s.heads, s.head_dim))
    flops = 4 * batch * s.heads * s.head_dim * new * (prefix + new / 2)
    c.record("prefill_bench", ok, batch=batch, prefix=prefix, new=new, us=round(t * 1e3, 1),
             sdpa_us=round(t_sdpa * 1e3, 1), ratio_vs_sdpa=round(t / t_sdpa, 3),
             tflops=round(flops / (t * 1e-3) / 1e12, 1))


def _figure(row: dict[str, object], key: str) -> float:
    value = row[key]
    assert isinstance(value, float | int), (key, value)
    return float(value)


def _copy_gbps() -> float:
    """Device-to-device copy bandwidth, bytes read plus written per second, of a 1 GiB buffer."""
    src = torch.empty(GIB, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2 * GIB / (_median_ms(lambda: dst.copy_(src)) * 1e-3) / 1e9


def run_checks(shape: ModelShape, quick: bool, seed: int) -> dict[str, object]:
    """Every check and timing on the current CUDA device; returns the JSON result."""
    gen = torch.Generator().manual_seed(seed)
    copy_gbps = _copy_gbps()
    blocks = -(-pool_tokens(shape) // shape.block_size)
    kv = torch.randn((blocks, shape.pool_layers, 2, shape.block_size, shape.kv_heads, shape.head_dim),
                     device="cuda", dtype=torch.bfloat16)
    c = Checker(shape, gen, kv, copy_gbps, [])
    print(f"device {torch.cuda.get_device_name()}: copy {copy_gbps:.0f} GB/s (read + write)")
    check_copies(c)
    check_decode(c, DECODE_BENCH[:3] if quick else DECODE_BENCH)
    check_prefill(c, PREFILL_BENCH[:1] if quick else PREFILL_BENCH)
    decode = [r for r in c.rows if r["kind"] == "decode_bench"]
    bound = [r for r in decode if r["bandwidth_bound"]] or decode
    copies = [r for r in c.rows if str(r["kind"]).startswith(("gather_triton", "scatter_triton"))]
    goals = {
        "decode_fraction_of_copy_min": min(_figure(r, "fraction_of_copy") for r in bound),
        "decode_ratio_vs_sdpa_max": max(_figure(r, "ratio_vs_sdpa") for r in bound),
        "gather_scatter_fraction_of_copy_min": min(_figure(r, "fraction_of_copy") for r in copies),
    }
    met = {"decode_bandwidth": goals["decode_fraction_of_copy_min"] >= 0.7,
           "decode_vs_sdpa": goals["decode_ratio_vs_sdpa_max"] <= 1.3,
           "gather_scatter_bandwidth": goals["gather_scatter_fraction_of_copy_min"] >= 0.8}
    return {"bench": "gpu_check", "device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "triton": triton.__version__, "correct": c.correct, "copy_gbps": round(copy_gbps, 1),
            "goals": goals, "goals_met": met, "rows": c.rows}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_check needs a CUDA device (torch.cuda.is_available() is False); nothing measured.",
              file=sys.stderr)
        return 2
    result = run_checks(LLAMA3_8B, quick=args.quick, seed=args.seed)
    result["plan"] = {"shape": asdict(LLAMA3_8B), "planned_gib": round(planned_bytes() / GIB, 1)}
    if not args.no_cluster:
        torch.cuda.empty_cache()  # the kernel checks' pools go back before two agents share the device
        cluster = gpu_cluster.run(gpu_cluster.parse_args(["--model", args.model, "--trials", "3" if args.quick else "5"]))
        result["cluster"] = cluster
        result["correct"] = bool(result["correct"]) and cluster["outputs_identical"] and not cluster["pulls_failed"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    return 0 if result["correct"] else 1


if __name__ == "__main__":
    sys.exit(main())
