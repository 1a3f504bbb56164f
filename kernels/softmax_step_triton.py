"""The online-softmax step both Triton attention kernels run per key tile (flash-attention style)."""

import triton
import triton.language as tl


@triton.jit
def softmax_step(m_i, l_i, acc, qk, v, PRECISION: tl.constexpr):
    """Fold one tile of scores `qk` [M, N] (masked entries -inf) and values `v` [N, D] into the state.

    State per query row: running max `m_i`, running sum of exp `l_i`, unnormalised output `acc`.
    Each tile must hold at least one unmasked score per row that has seen none yet, or m stays -inf.
    """
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    p = tl.exp(qk - m_new[:, None])
    alpha = tl.exp(m_i - m_new)
    l_new = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return m_new, l_new, acc
