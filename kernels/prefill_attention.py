"""Paged prefill (extend) attention, torch reference: new tokens over a cached prefix plus themselves.

For each sequence b (new tokens ``cu_seqlens[b]:cu_seqlens[b+1]``, prefix of ``prefix_lens[b]`` cached
tokens), the keys are the prefix gathered from its blocks followed by the new tokens' own K/V:

    keys:    [ prefix 0 .. P-1 (cache, via block_tables[b]) | new 0 .. N-1 (k, v arguments) ]
    query j: sees every prefix key and new keys 0 .. j            (causal, bottom-right aligned)

One sequence at a time: prefill batches are few and long, so the loop costs little and stays readable.
"""

import torch
import torch.nn.functional as F

from radixmesh.kernels.decode_attention import compute_dtype


def paged_prefill_attention_torch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache_k: torch.Tensor,
                                  cache_v: torch.Tensor, block_tables: torch.Tensor, prefix_lens: torch.Tensor,
                                  cu_seqlens: torch.Tensor, scale: float,
                                  out: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention of packed new tokens over their cached prefix and themselves; returns `out`.

    The new tokens' K/V come from `k`/`v`, not from the cache, so they may be written with `write_kv`
    before or after this call. Inputs validated by the caller.
    """
    block_size, kv_heads, head_dim = cache_k.shape[1], cache_k.shape[2], cache_k.shape[3]
    ct = compute_dtype(q.dtype)
    if out is None:
        out = torch.empty_like(q)
    bounds = cu_seqlens.tolist()
    for b, prefix in enumerate(prefix_lens.tolist()):
        start, end = bounds[b], bounds[b + 1]
        new = end - start
        if new == 0:
            continue
        table = block_tables[b, : -(-prefix // block_size)].long()
        keys = torch.cat([cache_k[table].reshape(-1, kv_heads, head_dim)[:prefix], k[start:end]]).to(ct)
        values = torch.cat([cache_v[table].reshape(-1, kv_heads, head_dim)[:prefix], v[start:end]]).to(ct)
        visible = torch.arange(prefix + new, device=q.device)[None, :] <= prefix + torch.arange(
            new, device=q.device)[:, None]  # [N, P+N]
        qs = q[start:end].to(ct).transpose(0, 1)[None]  # [1, heads, N, D]
        result = F.scaled_dot_product_attention(qs, keys.transpose(0, 1)[None], values.transpose(0, 1)[None],
                                                attn_mask=visible, scale=scale, enable_gqa=True)
        out[start:end] = result[0].transpose(0, 1)
    return out
