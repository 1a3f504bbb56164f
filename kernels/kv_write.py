"""KV cache write: scatter new tokens' K/V into their slots of the paged cache (torch reference)."""

import torch


def write_kv_torch(k: torch.Tensor, v: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor,
                   slot_mapping: torch.Tensor) -> None:
    """Store token t's ``k[t]``/``v[t]`` at slot ``slot_mapping[t] = block * block_size + offset``.

    Mutates only those slots of `cache_k`/`cache_v` (strided per-layer views of the tier's cache;
    indexing a view writes through to the cache). Inputs are validated by the caller.
    """
    block_size = cache_k.shape[1]
    slots = slot_mapping.long()
    blocks, offsets = slots // block_size, slots % block_size
    cache_k[blocks, offsets] = k
    cache_v[blocks, offsets] = v
