"""Block gather/scatter as one Triton kernel launch (the CUDA default).

Same contract as `block_copy.gather_blocks_torch` / `scatter_blocks_torch`. A block is contiguous across
layers, so each program copies one chunk of one block's flat bytes; runs of consecutive ids need no
special case because the whole list moves in a single launch either way.
"""

import torch
import triton
import triton.language as tl

from radixmesh.kernels.launch import on_interpreter

_CHUNK = 4096
"""Elements per program: 8 KiB of bf16, enough for wide vector loads on every warp."""


@triton.jit
def _copy_blocks_kernel(src_ptr, dst_ptr, ids_ptr, src_block_stride, dst_block_stride, block_numel,
                        GATHER: tl.constexpr, CHUNK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    block = tl.load(ids_ptr + i).to(tl.int64)
    # gather: cache block ids[i] -> buffer row i; scatter: buffer row i -> cache block ids[i].
    src_row = block if GATHER else i
    dst_row = i if GATHER else block
    offs = chunk * CHUNK + tl.arange(0, CHUNK)
    mask = offs < block_numel
    data = tl.load(src_ptr + src_row * src_block_stride + offs, mask=mask)
    tl.store(dst_ptr + dst_row * dst_block_stride + offs, data, mask=mask)


def _launch(src: torch.Tensor, dst: torch.Tensor, ids: list[int], gather: bool) -> None:
    if not ids:
        return
    block_numel = src[0].numel()
    chunk = min(_CHUNK, triton.next_power_of_2(block_numel))
    id_tensor = torch.tensor(ids, dtype=torch.int64, device=src.device)
    grid = (len(ids), triton.cdiv(block_numel, chunk))
    _copy_blocks_kernel[grid](src, dst, id_tensor, src.stride(0), dst.stride(0), block_numel,
                              GATHER=gather, CHUNK=chunk, num_warps=1 if on_interpreter() else 4)


def gather_blocks_triton(kv: torch.Tensor, block_ids: list[int], out: torch.Tensor | None = None) -> torch.Tensor:
    """Copy `block_ids` of `kv` into one contiguous buffer (`out` when given); returns it."""
    if out is None:
        out = torch.empty((len(block_ids), *kv.shape[1:]), dtype=kv.dtype, device=kv.device)
    _launch(kv, out, block_ids, gather=True)
    return out


def scatter_blocks_triton(buffer: torch.Tensor, kv: torch.Tensor, block_ids: list[int]) -> None:
    """Copy a contiguous buffer of blocks into the distinct `block_ids` of `kv`."""
    _launch(buffer, kv, block_ids, gather=False)
