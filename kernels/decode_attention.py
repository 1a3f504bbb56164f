"""Paged decode attention, torch reference: one query token per sequence over its cached K/V.

Readable first and vectorised over the batch, because the CPU engine runs it: each sequence's blocks
are gathered into a padded ``[B, L, kv_heads, head_dim]`` tensor, positions past a sequence's length are
masked, and torch's scaled_dot_product_attention (with GQA) does the rest. Softmax runs in float32 (float64 for float64 inputs).
"""

import torch
import torch.nn.functional as F


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The precision references accumulate in: float64 stays float64, everything else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def paged_decode_attention_torch(q: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor,
                                 block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                                 out: torch.Tensor | None = None) -> torch.Tensor:
    """``out[b, h] = softmax(scale * q[b, h] . K_b^T) V_b`` over the first ``seq_lens[b]`` cached tokens.

    K_b is read from blocks ``block_tables[b, :ceil(seq_lens[b] / block_size)]`` of `cache_k` (head
    ``h // (heads / kv_heads)``, GQA); returns `out` (allocated when None). Inputs validated by the caller.
    """
    batch, _, head_dim = q.shape
    block_size, kv_heads = cache_k.shape[1], cache_k.shape[2]
    ct = compute_dtype(q.dtype)
    num_table_blocks = -(-int(seq_lens.max()) // block_size)
    length = num_table_blocks * block_size
    valid = torch.arange(length, device=q.device)[None, :] < seq_lens[:, None]  # [B, L]
    # Padding entries may hold anything: point them at block 0, whose tokens are masked out anyway.
    table = torch.where(valid[:, ::block_size], block_tables[:, :num_table_blocks], 0).flatten().long()
    k = cache_k.index_select(0, table).view(batch, length, kv_heads, head_dim).to(ct)
    v = cache_v.index_select(0, table).view(batch, length, kv_heads, head_dim).to(ct)
    # Masked slots may hold anything, NaN included, and SDPA adds the mask to the scores (NaN - inf is
    # NaN) and weights V by zero (0 * NaN is NaN): clear them in the gathered copies.
    k[~valid] = 0
    v[~valid] = 0
    # SDPA over the gathered, strided views: one fused op instead of a matmul-softmax-matmul chain,
    # which pays off most when the cores are shared and every extra parallel region waits for them.
    result = F.scaled_dot_product_attention(
        q.to(ct)[:, :, None], k.transpose(1, 2), v.transpose(1, 2), attn_mask=valid[:, None, None, :],
        scale=scale, enable_gqa=True)[:, :, 0]
    if out is None:
        return result.to(q.dtype)
    out.copy_(result)
    return out
