"""Paged decode attention, torch reference: one query token per sequence over its cached K/V.

The CPU engine runs it, once per layer, so the per-step work is split off: `plan_decode_torch` builds a
`DecodeGather` once per forward (which cache rows each sequence reads, and the mask past its end), and
every layer's call reads through it. A cache row is one head's K (or V) of one token: ``head_dim``
contiguous values, at ``(block * stride0 + slot * stride1 + head * stride2) / head_dim`` in the cache's
storage read as rows, so a per-layer (strided) view is gathered without copying the view first.

    sequence b, kv head h:  rows of positions 0 .. L-1   (L = max length rounded up to a block)
    position p < len[b]:    block_tables[b, p // bs], slot p % bs
    position p >= len[b]:   position 0's row (always written, so finite), its score masked to -inf

Scores come from one batched matmul over the gathered K (each kv head's GQA group at once); the
weighted sum of V rows is an `embedding_bag` straight from the cache, so V is never copied. Softmax
runs in float32 (float64 for float64 inputs).
"""

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The precision references accumulate in: float64 stays float64, everything else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


class DecodeGather(NamedTuple):
    """What the torch reference reads for one decode batch, shared by every layer of a forward."""

    k_rows: torch.Tensor
    """[B * kv_heads * L] int32: the cache row of each (sequence, kv head, position)."""
    v_rows: torch.Tensor
    """[B * heads * L] int32: the same rows, one bag per query head (its kv head's rows)."""
    bag_offsets: torch.Tensor
    """[B * heads] int32: where each query head's bag starts in `v_rows`."""
    mask: torch.Tensor
    """[B * kv_heads, group, L] compute dtype: 0 inside the sequence, -inf past its end."""
    num_rows: int
    """Rows in the cache's storage from a per-layer view's first element (`cache_rows`)."""


@dataclass(frozen=True, slots=True)
class DecodePlan:
    """One decode batch, validated once per forward and read by every layer's attention call.

    The implementation that made it (kernels.dispatch: it runs every layer's call, picked once per
    forward), the sequences' tables and lengths, the per-layer cache view shape and strides the plan
    was made for (every layer's view must match), and the torch reference's gather (None for Triton,
    which reads the tables itself).
    """

    implementation: str
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    num_heads: int
    cache_shape: tuple[int, ...]
    cache_strides: tuple[int, ...]
    gather: DecodeGather | None = None


def decode_gather(cache_k: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
                  num_heads: int) -> DecodeGather:
    """The rows and mask for sequences of `seq_lens` (>= 1) tokens in `block_tables`, for caches laid
    out like `cache_k` (strides multiples of head_dim) and `num_heads` query heads."""
    batch = seq_lens.shape[0]
    block_size, kv_heads, head_dim = cache_k.shape[1], cache_k.shape[2], cache_k.shape[3]
    group = num_heads // kv_heads
    device = seq_lens.device
    length = -(-int(seq_lens.max()) // block_size) * block_size
    row_block, row_slot, row_head = (s // head_dim for s in cache_k.stride()[:3])
    num_rows = sum((n - 1) * s for n, s in zip(cache_k.shape[:3], cache_k.stride()[:3], strict=True)) // head_dim + 1
    pos = torch.arange(length, device=device)
    valid = pos < seq_lens[:, None]  # [B, L]
    token_rows = block_tables[:, pos // block_size].long() * row_block + (pos % block_size) * row_slot  # [B, L]
    token_rows = torch.where(valid, token_rows, token_rows[:, :1])
    heads = torch.arange(0, kv_heads * row_head, row_head, device=device)
    # int32 indices when the rows allow: the index reads are lighter and every layer reads them.
    index = torch.int32 if num_rows <= torch.iinfo(torch.int32).max else torch.int64
    rows = (token_rows[:, None, :] + heads[None, :, None]).to(index)  # [B, kv_heads, L]
    mask = torch.full((batch, 1, 1, length), float("-inf"), dtype=compute_dtype(cache_k.dtype), device=device)
    mask = mask.masked_fill_(valid[:, None, None, :], 0.0).expand(batch, kv_heads, group, length)
    return DecodeGather(
        k_rows=rows.flatten(),
        v_rows=rows[:, :, None, :].expand(batch, kv_heads, group, length).flatten(),
        bag_offsets=torch.arange(0, batch * num_heads * length, length, dtype=index, device=device),
        mask=mask.reshape(batch * kv_heads, group, length),
        num_rows=num_rows,
    )


def plan_decode_torch(block_tables: torch.Tensor, seq_lens: torch.Tensor, cache_k: torch.Tensor,
                      num_heads: int) -> DecodePlan:
    """The plan with its gather (inputs validated by the caller)."""
    gather = decode_gather(cache_k, block_tables, seq_lens, num_heads) if seq_lens.numel() else None
    return DecodePlan("torch", block_tables, seq_lens, num_heads, tuple(cache_k.shape), cache_k.stride(), gather)


def paged_decode_attention_torch(q: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor,
                                 block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                                 out: torch.Tensor | None = None,
                                 gather: DecodeGather | None = None) -> torch.Tensor:
    """``out[b, h] = softmax(scale * q[b, h] . K_b^T) V_b`` over the first ``seq_lens[b]`` cached tokens.

    K_b is read from blocks ``block_tables[b, :ceil(seq_lens[b] / block_size)]`` of `cache_k` (head
    ``h // (heads / kv_heads)``, GQA); returns `out` (allocated when None). `gather` is
    `decode_gather` of these tables and lengths, built here when None. Inputs validated by the caller.
    """
    batch, heads, head_dim = q.shape
    if batch == 0:
        return torch.empty_like(q) if out is None else out
    ct = compute_dtype(q.dtype)
    g = gather if gather is not None else decode_gather(cache_k, block_tables, seq_lens, heads)
    kv_heads = cache_k.shape[2]
    group, length = g.mask.shape[1], g.mask.shape[2]
    rows = (g.num_rows, head_dim), (head_dim, 1)  # the caches' storage as rows (module doc)
    k = cache_k.as_strided(*rows).index_select(0, g.k_rows).view(batch * kv_heads, length, head_dim)
    qg = q.reshape(batch * kv_heads, group, head_dim)
    if ct != q.dtype:  # converted only when needed: a no-op .to still costs a call, felt at batch 1
        k, qg = k.to(ct), qg.to(ct)
    weights = torch.baddbmm(g.mask, qg, k.transpose(1, 2), alpha=scale).softmax(-1)
    if ct != q.dtype:  # embedding_bag weighs rows in their own dtype: half caches sum V in half
        weights = weights.to(q.dtype)
    result = F.embedding_bag(g.v_rows, cache_v.as_strided(*rows), g.bag_offsets, mode="sum",
                             per_sample_weights=weights.view(-1)).view(batch, heads, head_dim)
    if out is None:
        return result
    out.copy_(result)
    return out
