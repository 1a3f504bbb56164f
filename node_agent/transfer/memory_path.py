"""Which memory pulled KV bytes travel through, decided once per agent and reported by it.

    host          the pool is in host memory (CPU agents): UCX sends and receives it as it is
    cuda-direct   the pool is on a GPU and UCX moves device memory itself (its cuda_copy transport;
                  cuda_ipc between processes of one node, GPUDirect RDMA where the fabric has it):
                  chunks are sent from, and received into, device memory
    cuda-staged   the pool is on a GPU but UCX lacks CUDA support (a build without it, or the Ray
                  object store): every chunk is copied to host memory before it is sent, and received
                  into host memory before it is scattered into the pool
"""

from collections.abc import Callable
from enum import StrEnum

import torch


class MemoryPath(StrEnum):
    HOST = "host"
    CUDA_DIRECT = "cuda-direct"
    CUDA_STAGED = "cuda-staged"

    @property
    def staged(self) -> bool:
        """Chunks of a device pool go through host memory."""
        return self is MemoryPath.CUDA_STAGED


def memory_path(pool_device: torch.device, transports: Callable[[], frozenset[str]]) -> MemoryPath:
    """The path for a pool on `pool_device` when the transport's active UCX transports are
    `transports()` (empty for a transport that carries host memory only). They are asked only for a
    device pool: asking makes ucxx create its context, which must happen on the loop that uses it."""
    if pool_device.type != "cuda":
        return MemoryPath.HOST
    return MemoryPath.CUDA_DIRECT if "cuda_copy" in transports() else MemoryPath.CUDA_STAGED


def host_buffer(nbytes: int, for_device: torch.device) -> torch.Tensor:
    """A host staging buffer; page-locked when it feeds a GPU, so its copies run at full speed."""
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=for_device.type == "cuda")
