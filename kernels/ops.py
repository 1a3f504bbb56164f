"""The kernels' entry points: each validates its arguments (ValueError, nothing written), then runs the
implementation `dispatch.select` picks (see the package docstring)."""

from collections.abc import Sequence

import torch

from radixmesh.kernels import paged_args
from radixmesh.kernels.block_copy import gather_blocks_torch, scatter_blocks_torch
from radixmesh.kernels.decode_attention import DecodePlan
from radixmesh.kernels.dispatch import kernel_set, select

__all__ = [
    "DecodePlan",
    "gather_blocks",
    "gather_blocks_torch",
    "paged_decode_attention",
    "paged_prefill_attention",
    "plan_decode",
    "scatter_blocks",
    "scatter_blocks_torch",
    "write_kv",
]


def write_kv(k: torch.Tensor, v: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Store new tokens' K/V ``[T, kv_heads, head_dim]`` at ``slot_mapping[t] = block * block_size + offset``.

    Slots must be distinct and inside the cache; only those slots change.
    """
    paged_args.check_write_args(k, v, cache_k, cache_v, slot_mapping)
    select(k, cache_k, slot_mapping).write_kv(k, v, cache_k, cache_v, slot_mapping)


def plan_decode(block_tables: torch.Tensor, seq_lens: torch.Tensor, cache_k: torch.Tensor,
                num_heads: int) -> DecodePlan:
    """Validate a decode batch once and prepare what every layer's `paged_decode_attention` reads.

    Sequence b attends to its first ``seq_lens[b]`` (>= 1) tokens, held in blocks ``block_tables[b]``,
    with `num_heads` query heads; the plan holds for every per-layer
    view shaped and strided like `cache_k` (all layers of one tier's cache), and the implementation
    picked here runs every call on it.
    """
    paged_args.check_decode_plan(block_tables, seq_lens, cache_k, num_heads)
    return select(cache_k, block_tables, seq_lens).plan_decode(block_tables, seq_lens, cache_k, num_heads)


def paged_decode_attention(q: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor, plan: DecodePlan,
                           scale: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of one query token per sequence of `plan`, q ``[B, heads, head_dim]``, over its cached tokens.

    Query head h reads kv head ``h // (heads / kv_heads)``; the new token's K/V must already be written.
    Returns `out` (``[B, heads, head_dim]`` in q's dtype; allocated when None), every element written.
    """
    paged_args.check_decode_call(q, cache_k, cache_v, plan)
    paged_args.check_out(out, q)
    return kernel_set(plan.implementation).paged_decode_attention(q, cache_k, cache_v, plan, scale, out)


def paged_prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache_k: torch.Tensor,
                            cache_v: torch.Tensor, block_tables: torch.Tensor, prefix_lens: torch.Tensor,
                            cu_seqlens: torch.Tensor, scale: float,
                            out: torch.Tensor | None = None) -> torch.Tensor:
    """Extend attention: packed new tokens over their cached prefix and, causally, over themselves.

    Sequence b's new tokens are rows ``cu_seqlens[b]:cu_seqlens[b+1]`` of q ``[T, heads, D]`` and of
    k, v ``[T, kv_heads, D]``; its prefix is the first ``prefix_lens[b]`` tokens of blocks
    ``block_tables[b]``. New token j attends to the whole prefix and new tokens 0..j. The new tokens'
    K/V are read from `k`/`v`, not from the cache, so `write_kv` may run before or after. Returns `out`
    (``[T, heads, D]``), every element written.
    """
    paged_args.check_prefill_args(q, k, v, cache_k, cache_v, block_tables, prefix_lens, cu_seqlens)
    paged_args.check_out(out, q)
    return select(q, cache_k, block_tables).paged_prefill_attention(
        q, k, v, cache_k, cache_v, block_tables, prefix_lens, cu_seqlens, scale, out)


def gather_blocks(kv: torch.Tensor, block_ids: Sequence[int], out: torch.Tensor | None = None) -> torch.Tensor:
    """Copy blocks `block_ids` of a tier's cache `kv` (all layers) into one contiguous buffer.

    Buffer row i is block ``block_ids[i]``; `out` may live on another device (a host-tier swap).
    Returns `out`, allocated on kv's device when None.
    """
    ids = [int(b) for b in block_ids]
    paged_args.check_block_ids(kv, ids, out, distinct=False)
    tensors = (kv,) if out is None else (kv, out)
    return select(*tensors).gather_blocks(kv, ids, out)


def scatter_blocks(buffer: torch.Tensor, kv: torch.Tensor, block_ids: Sequence[int]) -> None:
    """Copy buffer row i into block ``block_ids[i]`` of `kv` (all layers); ids must be distinct."""
    ids = [int(b) for b in block_ids]
    paged_args.check_block_ids(kv, ids, buffer, distinct=True)
    select(buffer, kv).scatter_blocks(buffer, kv, ids)
