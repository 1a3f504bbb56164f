"""CPU kernels benchmark: the torch-reference paged attention against dense SDPA on the same K/V.

The paged side reads K/V from a two-layer pool through random, non-contiguous block tables (as the CPU
engine does); the baseline is `torch.nn.functional.scaled_dot_product_attention` over the same values
laid out contiguously, measured in the same run. Both outputs are compared before timing. Prints the
figures, then one JSON line, also written to DIR/kernels_cpu.json (default bench/results).

    python bench/kernels_cpu.py [--batch 8 --context 1024 ...] [--out DIR] [--smoke]
"""

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from radixmesh.kernels.decode_attention import decode_gather, paged_decode_attention_torch
from radixmesh.kernels.prefill_attention import paged_prefill_attention_torch

RESULTS = Path(__file__).parent / "results"
SMOKE = {"batch": 2, "context": 64, "new_tokens": 16, "repeats": 3}


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time of `fn` over `repeats` runs after two warm-up runs."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--context", type=int, default=1024, help="cached tokens per sequence (decode)")
    p.add_argument("--new-tokens", type=int, default=128, help="new tokens per sequence (prefill)")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=RESULTS, help="folder for kernels_cpu.json")
    p.add_argument("--smoke", action="store_true", help=f"tiny run: {SMOKE}")
    a = p.parse_args()
    if a.smoke:  # smaller defaults; sizes given on the command line still win
        p.set_defaults(**SMOKE)
        a = p.parse_args()

    gen = torch.Generator().manual_seed(a.seed)
    batch, heads, kvh, d, bs = a.batch, a.heads, a.kv_heads, a.head_dim, a.block_size
    ctx = a.context
    per_seq = -(-(ctx + a.new_tokens) // bs)
    pool = torch.randn((batch * per_seq, 2, 2, bs, kvh, d), generator=gen)
    tables = torch.randperm(batch * per_seq, generator=gen).view(batch, per_seq).int()
    cache_k, cache_v = pool[:, 1, 0], pool[:, 1, 1]
    # The same values, contiguous: [B, kv_heads, tokens, D] as SDPA wants them.
    dense_k = cache_k[tables.long()].reshape(batch, -1, kvh, d).transpose(1, 2).contiguous()
    dense_v = cache_v[tables.long()].reshape(batch, -1, kvh, d).transpose(1, 2).contiguous()
    scale = 1 / math.sqrt(d)

    q = torch.randn((batch, heads, d), generator=gen)
    lens = torch.full((batch,), ctx, dtype=torch.int32)

    # Made once per forward and read by every layer (kernels.plan_decode): not part of a layer's time.
    gather = decode_gather(cache_k, tables, lens, heads)

    def paged_decode() -> torch.Tensor:
        return paged_decode_attention_torch(q, cache_k, cache_v, tables, lens, scale, None, gather)

    def dense_decode() -> torch.Tensor:
        return F.scaled_dot_product_attention(q[:, :, None], dense_k[:, :, :ctx], dense_v[:, :, :ctx],
                                              scale=scale, enable_gqa=True)[:, :, 0]

    torch.testing.assert_close(paged_decode(), dense_decode(), atol=1e-4, rtol=1e-4)
    t_paged = median_seconds(paged_decode, a.repeats)
    t_dense = median_seconds(dense_decode, a.repeats)

    # Prefill: `new` tokens per sequence over a paged prefix of ctx tokens.
    new = a.new_tokens
    qp = torch.randn((batch * new, heads, d), generator=gen)
    kp = dense_k[:, :, ctx : ctx + new].transpose(1, 2).reshape(-1, kvh, d)
    vp = dense_v[:, :, ctx : ctx + new].transpose(1, 2).reshape(-1, kvh, d)
    prefix = torch.full((batch,), ctx, dtype=torch.int32)
    cu = torch.arange(0, batch * new + 1, new, dtype=torch.int32)
    mask = causal_lower_right(new, ctx + new)

    def paged_prefill() -> torch.Tensor:
        return paged_prefill_attention_torch(qp, kp, vp, cache_k, cache_v, tables, prefix, cu, scale)

    def dense_prefill() -> torch.Tensor:
        q4 = qp.view(batch, new, heads, d).transpose(1, 2)
        out = F.scaled_dot_product_attention(q4, dense_k[:, :, : ctx + new], dense_v[:, :, : ctx + new],
                                             attn_mask=mask, scale=scale, enable_gqa=True)
        return out.transpose(1, 2).reshape(-1, heads, d)

    torch.testing.assert_close(paged_prefill(), dense_prefill(), atol=1e-4, rtol=1e-4)
    t_paged_prefill = median_seconds(paged_prefill, max(3, a.repeats // 3))
    t_dense_prefill = median_seconds(dense_prefill, max(3, a.repeats // 3))

    result: dict[str, object] = {
        "bench": "kernels_cpu",
        "shape": {"batch": batch, "heads": heads, "kv_heads": kvh, "head_dim": d, "context": ctx,
                  "new_tokens": new, "block_size": bs, "dtype": "float32"},
        "threads": torch.get_num_threads(),
        "paged_decode_ms": round(t_paged * 1e3, 3),
        "dense_sdpa_decode_ms": round(t_dense * 1e3, 3),
        "ratio_paged_vs_dense": round(t_paged / t_dense, 3),
        "paged_prefill_ms": round(t_paged_prefill * 1e3, 3),
        "dense_sdpa_prefill_ms": round(t_dense_prefill * 1e3, 3),
        "ratio_prefill_paged_vs_dense": round(t_paged_prefill / t_dense_prefill, 3),
    }
    print(f"decode  B={batch} ctx={ctx}: paged torch reference {result['paged_decode_ms']} ms, "
          f"dense SDPA {result['dense_sdpa_decode_ms']} ms, ratio {result['ratio_paged_vs_dense']}")
    print(f"prefill B={batch} prefix={ctx} new={new}: paged torch reference {result['paged_prefill_ms']} ms, "
          f"dense SDPA {result['dense_sdpa_prefill_ms']} ms, ratio {result['ratio_prefill_paged_vs_dense']}")
    if a.smoke:
        result["smoke"] = True
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "kernels_cpu.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
