"""Validation of the arguments the paged kernels share: caches, block tables, lengths, slots.

Every public kernel entry point calls one of these before touching memory, so a bad request raises
`ValueError` naming the argument and changes nothing. The checks of values (ranges of slots, block
ids and lengths) read the index tensors, which costs one device sync on CUDA; kernels themselves
trust their inputs and index memory directly.
"""

from collections.abc import Sequence
from itertools import pairwise

import torch

from radixmesh.kernels.decode_attention import DecodePlan

_INDEX_DTYPES = (torch.int32, torch.int64)


def _check_cache_pair(cache_k: torch.Tensor, cache_v: torch.Tensor) -> None:
    """Per-layer K/V views ``[num_blocks, block_size, kv_heads, head_dim]`` with the same shape."""
    if cache_k.dim() != 4:
        raise ValueError(f"cache_k must be [num_blocks, block_size, kv_heads, head_dim], got shape {tuple(cache_k.shape)}")
    if cache_v.shape != cache_k.shape or cache_v.dtype != cache_k.dtype:
        raise ValueError(f"cache_v {tuple(cache_v.shape)} {cache_v.dtype} must match cache_k "
              f"{tuple(cache_k.shape)} {cache_k.dtype}")
    if cache_k.stride(-1) != 1 or cache_v.stride(-1) != 1:
        raise ValueError("caches must be contiguous along head_dim")


def _check_same_device(**tensors: torch.Tensor) -> None:
    devices = {name: t.device for name, t in tensors.items()}
    if len(set(devices.values())) > 1:
        raise ValueError(f"all tensors must be on one device, got {devices}")


def _check_index(name: str, t: torch.Tensor, shape: tuple[int, ...], dtypes: tuple[torch.dtype, ...]) -> None:
    if t.dtype not in dtypes or tuple(t.shape) != shape:
        raise ValueError(f"{name} must be {[str(d) for d in dtypes]} of shape {shape}, got {t.dtype} {tuple(t.shape)}")


def _check_tables(block_tables: torch.Tensor, lens: torch.Tensor, batch: int, cache_k: torch.Tensor) -> None:
    """The first ceil(len / block_size) entries of each table row must name real blocks."""
    num_blocks, block_size = cache_k.shape[0], cache_k.shape[1]
    if block_tables.dtype != torch.int32 or block_tables.dim() != 2 or block_tables.shape[0] != batch:
        raise ValueError(f"block_tables must be int32 [{batch}, max_blocks], got {block_tables.dtype} "
              f"{tuple(block_tables.shape)}")
    capacity = block_tables.shape[1] * block_size
    if batch and int(lens.max()) > capacity:
        raise ValueError(f"a length {int(lens.max())} exceeds the block table capacity {capacity}")
    # Padding entries past a sequence's blocks are never read, so they may hold anything.
    used = torch.arange(block_tables.shape[1], device=lens.device)[None, :] * block_size < lens[:, None]
    ids = block_tables[used]
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= num_blocks):
        raise ValueError(f"block_tables name blocks outside [0, {num_blocks})")


def check_write_args(k: torch.Tensor, v: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor,
                     slot_mapping: torch.Tensor) -> None:
    """k, v ``[T, kv_heads, head_dim]`` in the caches' dtype; distinct slots inside the cache."""
    _check_cache_pair(cache_k, cache_v)
    _check_same_device(k=k, v=v, cache_k=cache_k, cache_v=cache_v, slot_mapping=slot_mapping)
    want = (k.shape[0], *cache_k.shape[2:])
    if k.shape != want or v.shape != want or k.dtype != cache_k.dtype or v.dtype != cache_k.dtype:
        raise ValueError(f"k and v must be {cache_k.dtype} {want}, got {k.dtype} {tuple(k.shape)}, "
              f"{v.dtype} {tuple(v.shape)}")
    _check_index("slot_mapping", slot_mapping, (k.shape[0],), _INDEX_DTYPES)
    num_slots = cache_k.shape[0] * cache_k.shape[1]
    if slot_mapping.numel():
        if int(slot_mapping.min()) < 0 or int(slot_mapping.max()) >= num_slots:
            raise ValueError(f"slot_mapping holds slots outside [0, {num_slots})")
        # Two tokens racing for one slot would leave whichever wrote last: refuse instead.
        if slot_mapping.unique().numel() != slot_mapping.numel():
            raise ValueError("slot_mapping holds a slot twice")


def check_decode_plan(block_tables: torch.Tensor, seq_lens: torch.Tensor, cache_k: torch.Tensor,
                      num_heads: int) -> None:
    """1 <= seq_lens <= table capacity, tables naming real blocks, num_heads a multiple of kv_heads, and
    cache strides in whole heads (the torch reference reads the cache as rows of head_dim values)."""
    if cache_k.dim() != 4:
        raise ValueError(f"cache_k must be [num_blocks, block_size, kv_heads, head_dim], got shape {tuple(cache_k.shape)}")
    _check_same_device(cache_k=cache_k, block_tables=block_tables, seq_lens=seq_lens)
    head_dim = cache_k.shape[-1]
    if cache_k.stride(-1) != 1 or any(s % head_dim for s in cache_k.stride()[:3]):
        raise ValueError(f"cache strides must be whole heads of {head_dim} contiguous values, got {cache_k.stride()}")
    if num_heads < 1 or num_heads % cache_k.shape[2]:
        raise ValueError(f"heads {num_heads} must be a multiple of kv_heads {cache_k.shape[2]}")
    if seq_lens.dtype != torch.int32 or seq_lens.dim() != 1:
        raise ValueError(f"seq_lens must be int32 [B], got {seq_lens.dtype} {tuple(seq_lens.shape)}")
    batch = seq_lens.shape[0]
    if batch and int(seq_lens.min()) < 1:
        raise ValueError("every seq_len must be >= 1: decode attends to at least the token itself")
    _check_tables(block_tables, seq_lens, batch, cache_k)


def check_decode_call(q: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor, plan: DecodePlan) -> None:
    """q ``[B, heads, head_dim]`` for the plan's B sequences and heads, in the caches' dtype and on their
    device; both caches shaped and strided as the plan's. Shapes only, and few of them: every layer
    calls this, and the plan's values were checked once when it was made."""
    want = (plan.seq_lens.shape[0], plan.num_heads, plan.cache_shape[-1])
    if (q.shape != want or q.dtype != cache_k.dtype or cache_v.dtype != cache_k.dtype
            or cache_k.shape != plan.cache_shape or cache_v.shape != plan.cache_shape
            or cache_k.stride() != plan.cache_strides or cache_v.stride() != plan.cache_strides
            or q.device != cache_k.device or cache_k.device != plan.block_tables.device):
        raise ValueError(f"q must be {cache_k.dtype} {want} and both caches {plan.cache_shape} with strides "
                         f"{plan.cache_strides}, all on the plan's {plan.block_tables.device}, got q {q.dtype} "
                         f"{tuple(q.shape)} on {q.device}, caches {cache_k.dtype} {tuple(cache_k.shape)} "
                         f"{cache_k.stride()} on {cache_k.device} / {cache_v.dtype} {tuple(cache_v.shape)} "
                         f"{cache_v.stride()}")


def check_prefill_args(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache_k: torch.Tensor,
                       cache_v: torch.Tensor, block_tables: torch.Tensor, prefix_lens: torch.Tensor,
                       cu_seqlens: torch.Tensor) -> None:
    """Packed q ``[T, heads, D]``, k/v ``[T, kv_heads, D]``; cu_seqlens ``[B+1]`` from 0 to T."""
    _check_cache_pair(cache_k, cache_v)
    _check_same_device(q=q, k=k, v=v, cache_k=cache_k, block_tables=block_tables,
                       prefix_lens=prefix_lens, cu_seqlens=cu_seqlens)
    _check_heads(q, cache_k)
    want = (q.shape[0], *cache_k.shape[2:])
    if k.shape != want or v.shape != want or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"k and v must be {q.dtype} {want}, got {k.dtype} {tuple(k.shape)}, {v.dtype} {tuple(v.shape)}")
    if cu_seqlens.dtype != torch.int32 or cu_seqlens.dim() != 1 or cu_seqlens.shape[0] < 1:
        raise ValueError(f"cu_seqlens must be int32 [B+1], got {cu_seqlens.dtype} {tuple(cu_seqlens.shape)}")
    batch = cu_seqlens.shape[0] - 1
    bounds = cu_seqlens.tolist()
    if bounds[0] != 0 or bounds[-1] != q.shape[0] or any(a > b for a, b in pairwise(bounds)):
        raise ValueError(f"cu_seqlens must rise from 0 to {q.shape[0]}, got {bounds}")
    _check_index("prefix_lens", prefix_lens, (batch,), (torch.int32,))
    if batch and int(prefix_lens.min()) < 0:
        raise ValueError("prefix_lens must be >= 0")
    _check_tables(block_tables, prefix_lens, batch, cache_k)


def _check_heads(q: torch.Tensor, cache_k: torch.Tensor) -> None:
    if q.dim() != 3 or q.shape[-1] != cache_k.shape[-1] or q.dtype != cache_k.dtype:
        raise ValueError(f"q must be {cache_k.dtype} [*, heads, {cache_k.shape[-1]}], got {q.dtype} {tuple(q.shape)}")
    if q.shape[1] % cache_k.shape[2]:
        raise ValueError(f"heads {q.shape[1]} must be a multiple of kv_heads {cache_k.shape[2]}")


def check_block_ids(kv: torch.Tensor, block_ids: Sequence[int], buffer: torch.Tensor | None,
                    distinct: bool) -> None:
    """Ids inside ``[0, num_blocks)`` (distinct when they are written to); buffer shaped like the blocks."""
    if kv.dim() != 6:
        raise ValueError(f"kv must be [num_blocks, layers, 2, block_size, kv_heads, head_dim], got {tuple(kv.shape)}")
    if kv[0].numel() and not kv[0].is_contiguous():
        raise ValueError("each block of kv must be contiguous across layers")
    bad = [b for b in block_ids if not 0 <= b < kv.shape[0]]
    if bad:
        raise ValueError(f"block ids {bad[:8]} outside [0, {kv.shape[0]})")
    if distinct and len(set(block_ids)) != len(block_ids):
        raise ValueError("block ids written to must be distinct")
    if buffer is not None:
        want = (len(block_ids), *kv.shape[1:])
        if tuple(buffer.shape) != want or buffer.dtype != kv.dtype or not buffer.is_contiguous():
            raise ValueError(f"buffer must be contiguous {kv.dtype} {want}, got {buffer.dtype} {tuple(buffer.shape)}")


def check_out(out: torch.Tensor | None, like: torch.Tensor) -> None:
    """A caller's output buffer must match the result exactly: shape, dtype, device, unit last stride."""
    if out is None:
        return
    if out.shape != like.shape or out.dtype != like.dtype or out.device != like.device or out.stride(-1) != 1:
        raise ValueError(f"out must be {like.dtype} {tuple(like.shape)} on {like.device}, got {out.dtype} "
                         f"{tuple(out.shape)} on {out.device}")
