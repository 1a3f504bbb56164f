"""Block gather/scatter over all layers at once: the copies behind transfers and host-tier swaps.

`kv` is a tier's cache ``[num_blocks, num_layers, 2, block_size, kv_heads, head_dim]`` (see
radixmesh.proto.kv_layout); a buffer is ``[n, num_layers, 2, block_size, kv_heads, head_dim]``,
contiguous, block i of the buffer being block ``block_ids[i]`` of the cache.
"""

from collections.abc import Iterator, Sequence

import torch


def _runs(block_ids: Sequence[int]) -> Iterator[tuple[int, int, int]]:
    """(buffer_start, cache_start, length) for each run of consecutive block ids.

    Runs are copied as one slice each, so a contiguously allocated sequence moves in one copy.
    """
    i = 0
    n = len(block_ids)
    while i < n:
        j = i + 1
        while j < n and block_ids[j] == block_ids[j - 1] + 1:
            j += 1
        yield i, block_ids[i], j - i
        i = j


def gather_blocks_torch(kv: torch.Tensor, block_ids: Sequence[int], out: torch.Tensor | None = None) -> torch.Tensor:
    """Copy `block_ids` of `kv` into one contiguous buffer (`out` when given)."""
    if out is None:
        out = torch.empty((len(block_ids), *kv.shape[1:]), dtype=kv.dtype, device=kv.device)
    assert out.shape == (len(block_ids), *kv.shape[1:]), (out.shape, kv.shape, len(block_ids))
    for b, c, n in _runs(block_ids):
        out[b : b + n].copy_(kv[c : c + n])
    return out


def scatter_blocks_torch(buffer: torch.Tensor, kv: torch.Tensor, block_ids: Sequence[int]) -> None:
    """Copy a contiguous buffer of blocks into `block_ids` of `kv`."""
    assert buffer.shape == (len(block_ids), *kv.shape[1:]), (buffer.shape, kv.shape, len(block_ids))
    for b, c, n in _runs(block_ids):
        kv[c : c + n].copy_(buffer[b : b + n])
