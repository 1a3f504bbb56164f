"""The one place that picks which implementation runs a kernel call.

Default: Triton when every tensor of the call is on CUDA, the torch reference otherwise (CPU, or a copy
between devices, which only torch's copy engine can do). ``RADIXMESH_KERNELS=torch|triton`` forces one;
any other value is an error. The variable is read on every call, so a test or an operator can switch.

Triton modules are imported on first use, not with the package: ``@triton.jit`` decides at import time
whether a kernel runs compiled or under ``TRITON_INTERPRET=1``, and CPU-only users never need them.
"""

import functools
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

from radixmesh.kernels.block_copy import gather_blocks_torch, scatter_blocks_torch
from radixmesh.kernels.decode_attention import DecodePlan, paged_decode_attention_torch, plan_decode_torch
from radixmesh.kernels.kv_write import write_kv_torch
from radixmesh.kernels.prefill_attention import paged_prefill_attention_torch

log = logging.getLogger(__name__)

ENV_VAR = "RADIXMESH_KERNELS"


@dataclass(frozen=True, slots=True)
class KernelSet:
    """One implementation of every kernel; signatures as in `radixmesh.kernels`."""

    name: str
    write_kv: Callable[..., None]
    plan_decode: Callable[..., DecodePlan]
    paged_decode_attention: Callable[..., torch.Tensor]
    paged_prefill_attention: Callable[..., torch.Tensor]
    gather_blocks: Callable[..., torch.Tensor]
    scatter_blocks: Callable[..., None]


def _torch_decode(q: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor, plan: DecodePlan, scale: float,
                  out: torch.Tensor | None) -> torch.Tensor:
    return paged_decode_attention_torch(q, cache_k, cache_v, plan.block_tables, plan.seq_lens, scale, out,
                                        plan.gather)


def _torch_set() -> KernelSet:
    return KernelSet("torch", write_kv_torch, plan_decode_torch, _torch_decode, paged_prefill_attention_torch,
                     gather_blocks_torch, scatter_blocks_torch)


def _triton_set() -> KernelSet:
    # Imported here, not at the top, and not to dodge a cycle: @triton.jit binds compiled vs
    # interpreted (TRITON_INTERPRET) when its module is imported, and CPU-only users never load Triton.
    from radixmesh.kernels.block_copy_triton import gather_blocks_triton, scatter_blocks_triton
    from radixmesh.kernels.decode_attention_triton import paged_decode_attention_triton
    from radixmesh.kernels.kv_write_triton import write_kv_triton
    from radixmesh.kernels.prefill_attention_triton import paged_prefill_attention_triton

    def plan_decode(block_tables: torch.Tensor, seq_lens: torch.Tensor, cache_k: torch.Tensor,
                    num_heads: int) -> DecodePlan:
        # The kernel reads the tables itself: nothing to prepare.
        return DecodePlan("triton", block_tables, seq_lens, num_heads, tuple(cache_k.shape), cache_k.stride())

    def decode(q: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor, plan: DecodePlan, scale: float,
               out: torch.Tensor | None) -> torch.Tensor:
        return paged_decode_attention_triton(q, cache_k, cache_v, plan.block_tables, plan.seq_lens, scale, out)

    return KernelSet("triton", write_kv_triton, plan_decode, decode, paged_prefill_attention_triton,
                     gather_blocks_triton, scatter_blocks_triton)


_REGISTRY: dict[str, Callable[[], KernelSet]] = {"torch": _torch_set, "triton": _triton_set}


@functools.cache
def kernel_set(name: str) -> KernelSet:
    """The implementation registered as `name` ("torch" or "triton"), loaded once."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown kernel implementation {name!r}; valid: {sorted(_REGISTRY)}")
    log.debug("loading %s kernels", name)
    return _REGISTRY[name]()


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def select(*tensors: torch.Tensor) -> KernelSet:
    """The implementation for a call on `tensors`, honouring ``RADIXMESH_KERNELS``.

    Raises ValueError for an unknown forced value, or for forced Triton on tensors it cannot reach
    (several devices, or CPU tensors without ``TRITON_INTERPRET=1``).
    """
    devices = {t.device for t in tensors}
    forced = os.environ.get(ENV_VAR, "")
    if not forced:
        on_cuda = len(devices) == 1 and next(iter(devices)).type == "cuda"
        return kernel_set("triton" if on_cuda else "torch")
    if forced not in _REGISTRY:
        raise ValueError(f"{ENV_VAR}={forced!r}; valid: {sorted(_REGISTRY)}")
    if forced == "triton":
        if len(devices) > 1:
            raise ValueError(f"{ENV_VAR}=triton needs all tensors on one device, got {sorted(map(str, devices))}")
        if next(iter(devices)).type != "cuda" and not _interpreting():
            raise ValueError(f"{ENV_VAR}=triton on CPU tensors needs TRITON_INTERPRET=1")
    return kernel_set(forced)
