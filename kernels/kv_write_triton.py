"""KV cache write as a Triton kernel (the CUDA default): one program per new token, K and V together."""

import torch
import triton
import triton.language as tl

from radixmesh.kernels.launch import on_interpreter


@triton.jit
def _write_kv_kernel(k_ptr, v_ptr, ck_ptr, cv_ptr, slots_ptr,
                     stride_kt, stride_kh, stride_vt, stride_vh,
                     stride_ckb, stride_cko, stride_ckh, stride_cvb, stride_cvo, stride_cvh,
                     BLOCK_SIZE: tl.constexpr, KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                     BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slots_ptr + t).to(tl.int64)
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    offs_h = tl.arange(0, BLOCK_H)[:, None]
    offs_d = tl.arange(0, BLOCK_D)[None, :]
    mask = (offs_h < KV_HEADS) & (offs_d < HEAD_DIM)
    k = tl.load(k_ptr + t * stride_kt + offs_h * stride_kh + offs_d, mask=mask)
    v = tl.load(v_ptr + t * stride_vt + offs_h * stride_vh + offs_d, mask=mask)
    tl.store(ck_ptr + block * stride_ckb + offset * stride_cko + offs_h * stride_ckh + offs_d, k, mask=mask)
    tl.store(cv_ptr + block * stride_cvb + offset * stride_cvo + offs_h * stride_cvh + offs_d, v, mask=mask)


def write_kv_triton(k: torch.Tensor, v: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor,
                    slot_mapping: torch.Tensor) -> None:
    """Store ``k[t]``/``v[t]`` at slot ``slot_mapping[t]``; same contract as `write_kv_torch`."""
    # The kernel addresses head_dim with unit stride.
    k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (k, v))
    tokens, kv_heads, head_dim = k.shape
    if tokens == 0:
        return
    _write_kv_kernel[(tokens,)](
        k, v, cache_k, cache_v, slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        cache_k.stride(0), cache_k.stride(1), cache_k.stride(2),
        cache_v.stride(0), cache_v.stride(1), cache_v.stride(2),
        BLOCK_SIZE=cache_k.shape[1], KV_HEADS=kv_heads, HEAD_DIM=head_dim,
        BLOCK_H=triton.next_power_of_2(kv_heads), BLOCK_D=triton.next_power_of_2(head_dim),
        num_warps=1 if on_interpreter() else 4,
    )
