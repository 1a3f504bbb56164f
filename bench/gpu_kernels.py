"""The kernels step of bench/gpu_check.py: every Triton kernel against its torch reference, then timings.

On a GPU, Llama-3-8B attention shapes (32 query heads, 8 KV heads, head_dim 128, block 16, bf16):
  1. correctness: write_kv / gather / scatter exactly equal; paged decode (batch 1-256, context up to
     32k, random non-contiguous tables, shared prefix blocks, ragged lengths) and paged prefill within
     bf16 tolerance of the torch reference;
  2. `triton.testing.do_bench` medians, every baseline measured in the same run: paged decode bandwidth
     as a fraction of a device-to-device copy (goal >= 0.7) and its time vs SDPA on the same K/V laid
     out contiguously (goal <= 1.3x); prefill over a paged prefix vs SDPA; gather/scatter bandwidth vs
     the copy (goal >= 0.8).
A smoke run does the same at tiny shapes in float32 on the CPU, the Triton kernels under
TRITON_INTERPRET=1 (set by gpu_check before they load) and timed by the wall clock: it proves the code
runs, not the goals. Needs torch and triton only.
"""

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

import torch
import torch.nn.functional as F
import triton.testing
from gpu_step import StepLog
from torch.nn.attention.bias import causal_lower_right

GIB = 1 << 30
BANDWIDTH_BOUND_BYTES = 256 << 20
"""Decode cases reading at least this much K/V are the ones held to the bandwidth goal."""

Timer = Callable[[Callable[[], object]], float]
"""Median milliseconds of a call."""


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


@dataclass(frozen=True, slots=True)
class KernelPlan:
    """The shapes and cases of one kernels step."""

    shape: ModelShape
    dtype: torch.dtype
    decode_checks: tuple[tuple[int, int], ...]
    """(batch, context): correctness with ragged lengths in [context / 2, context]."""
    decode_bench: tuple[tuple[int, int], ...]
    """(batch, context): timing with uniform lengths, so SDPA sees the same work without a mask."""
    prefill_checks: tuple[tuple[int, int, int], ...]
    """(batch, cached prefix, new tokens) per sequence."""
    prefill_bench: tuple[tuple[int, int, int], ...]
    copy_blocks: int
    """Blocks per gather/scatter."""
    write_tokens: int
    """Tokens per write_kv check."""
    baseline_bytes: int
    """Size of the buffer whose device copy is the bandwidth baseline."""

    def quick(self) -> "KernelPlan":
        """Fewer timing cases; correctness unchanged."""
        return replace(self, decode_bench=self.decode_bench[:3], prefill_bench=self.prefill_bench[:1])


LLAMA3_8B = ModelShape()
GPU_PLAN = KernelPlan(
    LLAMA3_8B, torch.bfloat16,
    decode_checks=((1, 32768), (16, 4096), (64, 2048), (256, 512)),
    decode_bench=((1, 512), (1, 32768), (8, 8192), (32, 4096), (64, 4096), (128, 2048), (256, 512), (256, 4096)),
    prefill_checks=((1, 0, 512), (4, 1000, 300), (2, 8192, 1024)),
    prefill_bench=((1, 4096, 512), (4, 8192, 1024), (1, 30720, 2048)),
    copy_blocks=512,  # 1 GiB of Llama-3-8B blocks per gather/scatter
    write_tokens=4096,
    baseline_bytes=GIB,
)
# float32: the interpreter's tl.dot mishandles bfloat16 (numpy has none).
SMOKE_PLAN = KernelPlan(
    ModelShape(heads=4, kv_heads=2, head_dim=32, pool_layers=2, copy_layers=2), torch.float32,
    decode_checks=((2, 40),), decode_bench=((2, 32),), prefill_checks=((2, 20, 12),), prefill_bench=((1, 32, 16),),
    copy_blocks=8, write_tokens=64, baseline_bytes=1 << 20,
)


def pool_tokens(plan: KernelPlan) -> int:
    """Tokens the shared attention pool must hold: the largest case of any table, plus slack."""
    decode = max(b * c for b, c in plan.decode_checks + plan.decode_bench)
    prefill = max(b * (p + n) for b, p, n in plan.prefill_checks + plan.prefill_bench)
    return max(decode, prefill) + 64 * plan.shape.block_size


def planned_bytes(plan: KernelPlan) -> int:
    """Device memory the step allocates at its peak (pool, a contiguous K/V copy for SDPA, copies)."""
    s = plan.shape
    token_bytes = s.kv_heads * s.head_dim * 2 * plan.dtype.itemsize  # K and V
    pool = pool_tokens(plan) * s.pool_layers * token_bytes
    dense = max(b * c for b, c in plan.decode_bench) * token_bytes
    block = s.copy_layers * s.block_size * token_bytes
    copies = (2 * plan.copy_blocks) * block + 2 * plan.baseline_bytes
    return pool + 2 * dense + copies


def device_timer(fn: Callable[[], object]) -> float:
    return float(triton.testing.do_bench(fn, return_mode="median"))


def wall_timer(fn: Callable[[], object]) -> float:
    """The CPU's stand-in for do_bench (which needs CUDA events): median of three wall-clock calls."""
    times = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


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
    """The shared attention pool, the random source, the timer and where rows go."""

    plan: KernelPlan
    device: torch.device
    gen: torch.Generator
    kv: torch.Tensor
    copy_gbps: float
    timer: Timer
    log: StepLog

    @property
    def caches(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.kv[:, 1, 0], self.kv[:, 1, 1]

    def randn(self, *shape: int) -> torch.Tensor:
        return torch.randn(shape, device=self.device, dtype=self.plan.dtype)

    def tables(self, block_counts: list[int], shared: int) -> torch.Tensor:
        """Random non-contiguous tables; the first `shared` blocks are common to every sequence."""
        perm = torch.randperm(self.kv.shape[0], generator=self.gen)
        rows = torch.zeros((len(block_counts), max(block_counts) + 1), dtype=torch.int32)
        used = shared
        for b, n in enumerate(block_counts):
            rows[b, :shared] = perm[:shared]
            rows[b, shared:n] = perm[used : used + n - shared]
            used += n - shared
        return rows.to(self.device)


def _close(got: torch.Tensor, want: torch.Tensor) -> tuple[bool, float]:
    err = float((got.float() - want.float()).abs().max())
    return bool(torch.isfinite(got).all()) and torch.allclose(got.float(), want.float(), atol=2e-2, rtol=2e-2), err


def check_copies(c: Checker) -> None:
    from radixmesh.kernels.block_copy import gather_blocks_torch
    from radixmesh.kernels.block_copy_triton import gather_blocks_triton, scatter_blocks_triton
    from radixmesh.kernels.kv_write import write_kv_torch
    from radixmesh.kernels.kv_write_triton import write_kv_triton

    s, n = c.plan.shape, c.plan.write_tokens
    blocks = 2 * n // s.block_size
    small = torch.randn((blocks, 2, 2, s.block_size, s.kv_heads, s.head_dim), generator=c.gen).to(c.plan.dtype)
    small = small.to(c.device)
    slots = torch.randperm(blocks * s.block_size, generator=c.gen)[:n].to(c.device)
    k = c.randn(n, s.kv_heads, s.head_dim)
    v = torch.randn_like(k)
    a, b = small.clone(), small.clone()
    write_kv_triton(k, v, a[:, 1, 0], a[:, 1, 1], slots)
    write_kv_torch(k, v, b[:, 1, 0], b[:, 1, 1], slots)
    c.log.record("write_kv", torch.equal(a, b), tokens=n)

    count = c.plan.copy_blocks
    pool = c.randn(2 * count + 16, s.copy_layers, 2, s.block_size, s.kv_heads, s.head_dim)
    ids = torch.randperm(pool.shape[0], generator=c.gen)[:count].tolist()
    run = list(range(8, 8 + count))
    buf = gather_blocks_triton(pool, ids)
    c.log.record("gather", torch.equal(buf, gather_blocks_torch(pool, ids)), blocks=count)
    target = pool.clone()
    scatter_blocks_triton(buf, target, run)
    c.log.record("scatter", torch.equal(target[8 : 8 + count], buf), blocks=count)
    moved = 2 * buf.numel() * buf.element_size()
    for name, fn in [("gather_triton_random", lambda: gather_blocks_triton(pool, ids, buf)),
                     ("gather_triton_run", lambda: gather_blocks_triton(pool, run, buf)),
                     ("gather_torch_random", lambda: gather_blocks_torch(pool, ids, buf)),
                     ("scatter_triton_random", lambda: scatter_blocks_triton(buf, target, ids))]:
        gbps = moved / (c.timer(fn) * 1e-3) / 1e9
        c.log.record(name, gbps=round(gbps, 3), fraction_of_copy=round(gbps / c.copy_gbps, 3))


def check_decode(c: Checker) -> None:
    from radixmesh.kernels.decode_attention import paged_decode_attention_torch
    from radixmesh.kernels.decode_attention_triton import paged_decode_attention_triton

    s, (ck, cv) = c.plan.shape, c.caches
    scale = 1 / math.sqrt(s.head_dim)
    for batch, ctx in c.plan.decode_checks:
        lens = torch.randint(ctx // 2, ctx + 1, (batch,), generator=c.gen, dtype=torch.int32)
        counts = [-(-int(n) // s.block_size) for n in lens]
        tables = c.tables(counts, shared=min(8, min(counts) // 2))
        q = c.randn(batch, s.heads, s.head_dim)
        lens = lens.to(c.device)
        got = paged_decode_attention_triton(q, ck, cv, tables, lens, scale)
        ok, err = _close(got, paged_decode_attention_torch(q, ck, cv, tables, lens, scale))
        c.log.record("decode_check", ok, batch=batch, context=ctx, max_abs_err=round(err, 5))
    for batch, ctx in c.plan.decode_bench:
        _decode_bench_case(c, batch, ctx)


def _decode_bench_case(c: Checker, batch: int, ctx: int) -> None:
    from radixmesh.kernels.decode_attention_triton import paged_decode_attention_triton

    s, (ck, cv) = c.plan.shape, c.caches
    scale = 1 / math.sqrt(s.head_dim)
    tables = c.tables([ctx // s.block_size] * batch, shared=0)
    lens = torch.full((batch,), ctx, dtype=torch.int32, device=c.device)
    q = c.randn(batch, s.heads, s.head_dim)
    out = torch.empty_like(q)
    dense_k = ck[tables[:, :-1].long()].view(batch, ctx, s.kv_heads, s.head_dim).transpose(1, 2).contiguous()
    dense_v = cv[tables[:, :-1].long()].view(batch, ctx, s.kv_heads, s.head_dim).transpose(1, 2).contiguous()
    ok, _ = _close(paged_decode_attention_triton(q, ck, cv, tables, lens, scale, out),
                   _sdpa(q[:, :, None], dense_k, dense_v, scale)[:, :, 0])
    t = c.timer(lambda: paged_decode_attention_triton(q, ck, cv, tables, lens, scale, out))
    t_sdpa = c.timer(lambda: _sdpa(q[:, :, None], dense_k, dense_v, scale))
    kv_bytes = 2 * dense_k.numel() * dense_k.element_size()
    gbps = kv_bytes / (t * 1e-3) / 1e9
    c.log.record("decode_bench", ok, batch=batch, context=ctx, us=round(t * 1e3, 1), sdpa_us=round(t_sdpa * 1e3, 1),
                 ratio_vs_sdpa=round(t / t_sdpa, 3), gbps=round(gbps, 3),
                 fraction_of_copy=round(gbps / c.copy_gbps, 3), bandwidth_bound=kv_bytes >= BANDWIDTH_BOUND_BYTES)


def check_prefill(c: Checker) -> None:
    from radixmesh.kernels.prefill_attention import paged_prefill_attention_torch
    from radixmesh.kernels.prefill_attention_triton import paged_prefill_attention_triton

    s, (ck, cv) = c.plan.shape, c.caches
    scale = 1 / math.sqrt(s.head_dim)

    def inputs(prefixes: list[int], news: list[int]) -> tuple[torch.Tensor, ...]:
        counts = [max(1, -(-p // s.block_size)) for p in prefixes]
        tables = c.tables(counts, shared=min(counts) // 2)
        cu = torch.tensor([0, *torch.tensor(news).cumsum(0).tolist()], dtype=torch.int32, device=c.device)
        q = c.randn(sum(news), s.heads, s.head_dim)
        k = c.randn(sum(news), s.kv_heads, s.head_dim)
        return q, k, torch.randn_like(k), tables, torch.tensor(prefixes, dtype=torch.int32, device=c.device), cu

    for batch, prefix, new in c.plan.prefill_checks:
        prefixes = [int(torch.randint(prefix // 2, prefix + 1, (), generator=c.gen)) for _ in range(batch)]
        news = [int(torch.randint(new // 2, new + 1, (), generator=c.gen)) for _ in range(batch)]
        q, k, v, tables, pl, cu = inputs(prefixes, news)
        got = paged_prefill_attention_triton(q, k, v, ck, cv, tables, pl, cu, scale)
        ok, err = _close(got, paged_prefill_attention_torch(q, k, v, ck, cv, tables, pl, cu, scale))
        c.log.record("prefill_check", ok, batch=batch, prefix=prefix, new=new, max_abs_err=round(err, 5))
    for batch, prefix, new in c.plan.prefill_bench:
        _prefill_bench_case(c, batch, prefix, new, inputs([prefix] * batch, [new] * batch))


def _prefill_bench_case(c: Checker, batch: int, prefix: int, new: int, args: tuple[torch.Tensor, ...]) -> None:
    from radixmesh.kernels.prefill_attention_triton import paged_prefill_attention_triton

    s, (ck, cv) = c.plan.shape, c.caches
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
    t = c.timer(lambda: paged_prefill_attention_triton(q, k, v, ck, cv, tables, pl, cu, scale, out))
    t_sdpa = c.timer(lambda: _sdpa(q4, dk, dv, scale, mask))
    ok, _ = _close(out, _sdpa(q4, dk, dv, scale, mask).transpose(1, 2).reshape(-1, s.heads, s.head_dim))
    flops = 4 * batch * s.heads * s.head_dim * new * (prefix + new / 2)
    c.log.record("prefill_bench", ok, batch=batch, prefix=prefix, new=new, us=round(t * 1e3, 1),
                 sdpa_us=round(t_sdpa * 1e3, 1), ratio_vs_sdpa=round(t / t_sdpa, 3),
                 tflops=round(flops / (t * 1e-3) / 1e12, 3))


def _figure(row: dict[str, object], key: str) -> float:
    value = row[key]
    assert isinstance(value, float | int), (key, value)
    return float(value)


def copy_gbps(nbytes: int, device: torch.device, timer: Timer) -> float:
    """Device-to-device copy bandwidth, bytes read plus written per second, of an `nbytes` buffer."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * nbytes / (timer(lambda: dst.copy_(src)) * 1e-3) / 1e9


def run(plan: KernelPlan, device: torch.device, seed: int, log: StepLog) -> dict[str, object]:
    """Every check and timing of `plan` on `device`, into `log`; returns the goals and whether they are met."""
    timer = device_timer if device.type == "cuda" else wall_timer
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    baseline = copy_gbps(plan.baseline_bytes, device, timer)
    s = plan.shape
    blocks = -(-pool_tokens(plan) // s.block_size)
    kv = torch.randn((blocks, s.pool_layers, 2, s.block_size, s.kv_heads, s.head_dim), device=device,
                     dtype=plan.dtype)
    c = Checker(plan, device, gen, kv, baseline, timer, log)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"device {name}: copy {baseline:.1f} GB/s (read + write)", flush=True)
    log.summary.update(device=name, copy_gbps=round(baseline, 3), shape=asdict(s), dtype=str(plan.dtype),
                       planned_gib=round(planned_bytes(plan) / GIB, 3))
    check_copies(c)
    check_decode(c)
    check_prefill(c)
    decode = [r for r in log.rows if r["kind"] == "decode_bench"]
    bound = [r for r in decode if r["bandwidth_bound"]] or decode
    copies = [r for r in log.rows if str(r["kind"]).startswith(("gather_triton", "scatter_triton"))]
    goals = {
        "decode_fraction_of_copy_min": min(_figure(r, "fraction_of_copy") for r in bound),
        "decode_ratio_vs_sdpa_max": max(_figure(r, "ratio_vs_sdpa") for r in bound),
        "gather_scatter_fraction_of_copy_min": min(_figure(r, "fraction_of_copy") for r in copies),
    }
    met = {"decode_bandwidth": goals["decode_fraction_of_copy_min"] >= 0.7,
           "decode_vs_sdpa": goals["decode_ratio_vs_sdpa_max"] <= 1.3,
           "gather_scatter_bandwidth": goals["gather_scatter_fraction_of_copy_min"] >= 0.8}
    return {"goals": goals, "goals_met": met}
