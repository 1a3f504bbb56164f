"""Paged decode attention in Triton (the CUDA default), split-K in two launches.

Stage 1, one program per (sequence, kv head, split): the split's tokens are read tile by tile through
the block table, and all query heads of the kv head's GQA group share each K/V tile (so K/V are read
once per group). It writes a normalised partial output and its log-sum-exp. Stage 2, one program per
(sequence, head), merges the splits. Splitting the context lets a small batch of long sequences fill
the device: a split is never shorter than `_MIN_SPLIT_TOKENS`.

    tokens of sequence b:  [ split 0: 0 .. S-1 | split 1: S .. 2S-1 | ... ]   S = split_len
    split s, tile at n:     positions n .. n+BLOCK_N-1 -> block_tables[b, pos // bs], slot pos % bs
"""

import torch
import triton
import triton.language as tl

from radixmesh.kernels.launch import dot_precision, on_interpreter, sm_count
from radixmesh.kernels.softmax_step_triton import softmax_step

_MIN_SPLIT_TOKENS = 256
_PROGRAMS_PER_SM = 2


@triton.jit
def _decode_split_kernel(q_ptr, k_ptr, v_ptr, tables_ptr, lens_ptr, mid_o_ptr, mid_lse_ptr, scale,
                         stride_qb, stride_qh, stride_kb, stride_ko, stride_kh, stride_vb, stride_vo, stride_vh,
                         stride_tb, split_len, num_splits,
                         GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
                         BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                         PRECISION: tl.constexpr):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    s = tl.program_id(2)
    seq_len = tl.load(lens_ptr + b)
    lo = s * split_len
    hi = tl.minimum(lo + split_len, seq_len)
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    h_mask = offs_h < GROUP
    d_mask = offs_d < HEAD_DIM
    heads = kvh * GROUP + offs_h
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                mask=h_mask[:, None] & d_mask[None, :], other=0.0)
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    table = tables_ptr + b.to(tl.int64) * stride_tb
    for start in range(lo, hi, BLOCK_N):
        pos = start + offs_n
        n_mask = pos < hi
        block = tl.load(table + pos // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
        slot = (pos % BLOCK_SIZE)[:, None]
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(k_ptr + block[:, None] * stride_kb + slot * stride_ko + kvh * stride_kh + offs_d[None, :],
                    mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + block[:, None] * stride_vb + slot * stride_vo + kvh * stride_vh + offs_d[None, :],
                    mask=kv_mask, other=0.0)
        qk = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        qk = tl.where(n_mask[None, :], qk, float("-inf"))
        m_i, l_i, acc = softmax_step(m_i, l_i, acc, qk, v, PRECISION)
    # A split past the end of its sequence saw nothing: weight it out with lse = -inf.
    seen = l_i > 0
    safe_l = tl.where(seen, l_i, 1.0)
    lse = tl.where(seen, m_i + tl.log(safe_l), float("-inf"))
    row = (b * tl.num_programs(1) * GROUP + heads).to(tl.int64) * num_splits + s
    tl.store(mid_o_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], acc / safe_l[:, None],
             mask=h_mask[:, None] & d_mask[None, :])
    tl.store(mid_lse_ptr + row, lse, mask=h_mask)


@triton.jit
def _decode_merge_kernel(mid_o_ptr, mid_lse_ptr, out_ptr, stride_ob, stride_oh, num_splits,
                         HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_mask = offs_s < num_splits
    d_mask = offs_d < HEAD_DIM
    rows = (b * tl.num_programs(1) + h).to(tl.int64) * num_splits + offs_s
    lse = tl.load(mid_lse_ptr + rows, mask=s_mask, other=float("-inf"))
    o = tl.load(mid_o_ptr + rows[:, None] * HEAD_DIM + offs_d[None, :],
                mask=s_mask[:, None] & d_mask[None, :], other=0.0)
    weight = tl.exp(lse - tl.max(lse, 0))
    merged = tl.sum(weight[:, None] * o, 0) / tl.sum(weight, 0)
    tl.store(out_ptr + b * stride_ob + h * stride_oh + offs_d, merged.to(out_ptr.dtype.element_ty), mask=d_mask)


def choose_num_splits(batch: int, kv_heads: int, max_len: int, block_n: int, sms: int) -> int:
    """Splits per sequence: enough (batch * kv_heads * splits) programs to fill `sms` SMs twice over,
    but no split shorter than `_MIN_SPLIT_TOKENS` (their merge would cost more than it saves)."""
    wanted = triton.cdiv(_PROGRAMS_PER_SM * sms, max(1, batch * kv_heads))
    by_length = triton.cdiv(max_len, max(_MIN_SPLIT_TOKENS, block_n))
    return max(1, min(wanted, by_length))


def paged_decode_attention_triton(q: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor,
                                  block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                                  out: torch.Tensor | None = None, num_splits: int | None = None) -> torch.Tensor:
    """Same contract as `paged_decode_attention_torch`; `num_splits` overrides the split heuristic.

    The split count comes from the table capacity (``max_blocks * block_size``), not from `seq_lens`,
    so launching never waits on the device.
    """
    batch, heads, head_dim = q.shape
    block_size, kv_heads = cache_k.shape[1], cache_k.shape[2]
    group = heads // kv_heads
    precision = dot_precision(q.dtype)
    # The kernel addresses head_dim with unit stride.
    q = q if q.stride(-1) == 1 else q.contiguous()
    if out is None:
        out = torch.empty_like(q)
    if batch == 0:
        return out
    # Small tiles on the interpreter make tiny test shapes cross tile and split boundaries.
    block_n = 16 if on_interpreter() else 64
    capacity = block_tables.shape[1] * block_size
    splits = num_splits or choose_num_splits(batch, kv_heads, capacity, block_n, sm_count(q.device))
    split_len = triton.cdiv(triton.cdiv(capacity, splits), block_n) * block_n
    mid_o = torch.empty((batch, heads, splits, head_dim), dtype=torch.float32, device=q.device)
    mid_lse = torch.empty((batch, heads, splits), dtype=torch.float32, device=q.device)
    warps = 1 if on_interpreter() else 4
    _decode_split_kernel[(batch, kv_heads, splits)](
        q, cache_k, cache_v, block_tables, seq_lens, mid_o, mid_lse, scale,
        q.stride(0), q.stride(1), cache_k.stride(0), cache_k.stride(1), cache_k.stride(2),
        cache_v.stride(0), cache_v.stride(1), cache_v.stride(2), block_tables.stride(0), split_len, splits,
        GROUP=group, BLOCK_SIZE=block_size, HEAD_DIM=head_dim, BLOCK_H=max(16, triton.next_power_of_2(group)),
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)), BLOCK_N=block_n, PRECISION=precision,
        num_warps=warps, num_stages=2,
    )
    _decode_merge_kernel[(batch, heads)](
        mid_o, mid_lse, out, out.stride(0), out.stride(1), splits,
        HEAD_DIM=head_dim, BLOCK_D=triton.next_power_of_2(head_dim), BLOCK_S=triton.next_power_of_2(splits),
        num_warps=warps,
    )
    return out
