"""Paged prefill (extend) attention in Triton (the CUDA default).

One program per (sequence, query head, tile of BLOCK_M new tokens). It first streams the cached prefix
through the block table (every new token sees all of it, so no causal mask), then the new tokens' own
K/V from the packed `k`/`v` up to the tile's last query, causally masked:

    keys of sequence b:  [ prefix 0 .. P-1 : cache via block_tables[b] | new 0 .. N-1 : k, v rows ]
    query m (new index): all prefix keys, new keys n <= m
"""

import torch
import triton
import triton.language as tl

from radixmesh.kernels.launch import dot_precision, on_interpreter
from radixmesh.kernels.softmax_step_triton import softmax_step


@triton.jit
def _prefill_kernel(q_ptr, k_ptr, v_ptr, ck_ptr, cv_ptr, tables_ptr, prefix_ptr, cu_ptr, out_ptr, scale,
                    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                    stride_ckb, stride_cko, stride_ckh, stride_cvb, stride_cvo, stride_cvh,
                    stride_tb, stride_ot, stride_oh,
                    GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                    PRECISION: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    m_start = tl.program_id(2) * BLOCK_M
    first = tl.load(cu_ptr + b)
    new = tl.load(cu_ptr + b + 1) - first
    if m_start >= new:
        return
    prefix = tl.load(prefix_ptr + b)
    kvh = h // GROUP
    offs_m = m_start + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    m_mask = offs_m < new
    d_mask = offs_d < HEAD_DIM
    rows = (first + offs_m).to(tl.int64)
    q = tl.load(q_ptr + rows[:, None] * stride_qt + h * stride_qh + offs_d[None, :],
                mask=m_mask[:, None] & d_mask[None, :], other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    table = tables_ptr + b.to(tl.int64) * stride_tb
    for start in range(0, prefix, BLOCK_N):
        pos = start + offs_n
        n_mask = pos < prefix
        block = tl.load(table + pos // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
        slot = (pos % BLOCK_SIZE)[:, None]
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(ck_ptr + block[:, None] * stride_ckb + slot * stride_cko + kvh * stride_ckh + offs_d[None, :],
                    mask=kv_mask, other=0.0)
        v = tl.load(cv_ptr + block[:, None] * stride_cvb + slot * stride_cvo + kvh * stride_cvh + offs_d[None, :],
                    mask=kv_mask, other=0.0)
        qk = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        qk = tl.where(n_mask[None, :], qk, float("-inf"))
        m_i, l_i, acc = softmax_step(m_i, l_i, acc, qk, v, PRECISION)
    # Rows past `new` (tile padding) also see new key 0, so no row ends with an empty softmax.
    for start in range(0, tl.minimum(new, m_start + BLOCK_M), BLOCK_N):
        pos = start + offs_n
        n_mask = pos < new
        kv_rows = (first + pos).to(tl.int64)[:, None]
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(k_ptr + kv_rows * stride_kt + kvh * stride_kh + offs_d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + kv_rows * stride_vt + kvh * stride_vh + offs_d[None, :], mask=kv_mask, other=0.0)
        qk = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        visible = n_mask[None, :] & (pos[None, :] <= offs_m[:, None])
        qk = tl.where(visible, qk, float("-inf"))
        m_i, l_i, acc = softmax_step(m_i, l_i, acc, qk, v, PRECISION)
    result = acc / l_i[:, None]
    tl.store(out_ptr + rows[:, None] * stride_ot + h * stride_oh + offs_d[None, :],
             result.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & d_mask[None, :])


def paged_prefill_attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache_k: torch.Tensor,
                                   cache_v: torch.Tensor, block_tables: torch.Tensor, prefix_lens: torch.Tensor,
                                   cu_seqlens: torch.Tensor, scale: float,
                                   out: torch.Tensor | None = None) -> torch.Tensor:
    """Same contract as `paged_prefill_attention_torch` (new tokens' K/V from `k`/`v`)."""
    heads, head_dim = q.shape[1], q.shape[2]
    block_size, kv_heads = cache_k.shape[1], cache_k.shape[2]
    precision = dot_precision(q.dtype)
    # The kernel addresses head_dim with unit stride.
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    if out is None:
        out = torch.empty_like(q)
    batch = cu_seqlens.shape[0] - 1
    # One host sync for the grid's third axis; prefill is long enough that it does not show.
    max_new = int((cu_seqlens[1:] - cu_seqlens[:-1]).max()) if batch else 0
    if max_new == 0:
        return out
    # Small tiles on the interpreter make tiny test shapes cross tile boundaries.
    block_m, block_n = (16, 16) if on_interpreter() else (64, 64)
    _prefill_kernel[(batch, heads, triton.cdiv(max_new, block_m))](
        q, k, v, cache_k, cache_v, block_tables, prefix_lens, cu_seqlens, out, scale,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        cache_k.stride(0), cache_k.stride(1), cache_k.stride(2), cache_v.stride(0), cache_v.stride(1),
        cache_v.stride(2), block_tables.stride(0), out.stride(0), out.stride(1),
        GROUP=heads // kv_heads, BLOCK_SIZE=block_size, HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)), PRECISION=precision,
        num_warps=1 if on_interpreter() else 4, num_stages=2,
    )
    return out
