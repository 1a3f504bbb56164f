"""The shape of one node's KV cache, and the fingerprint that decides who can share blocks.

Memory layout of a tier's cache: one tensor ``[num_blocks, num_layers, 2, block_size, num_kv_heads,
head_dim]`` (2 = K, V). A block's bytes for every layer are contiguous, so a transfer or a host-tier
swap of a run of blocks is one slice copy; per-layer K/V are strided views
``cache[:, layer, 0]`` / ``cache[:, layer, 1]`` of shape ``[num_blocks, block_size, kv_heads, head_dim]``
which the kernels read through their block stride.
"""

import hashlib
import json
from dataclasses import asdict, dataclass

import torch

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True, slots=True)
class KVLayout:
    """Everything that must match for two nodes to exchange KV blocks byte for byte."""

    model_id: str
    """Name of the weights (a seeded random model names its seed)."""
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str
    """One of float32, float16, bfloat16."""
    block_size: int
    """Tokens per block."""

    def __post_init__(self) -> None:
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {self.dtype!r}")
        for name in ("num_layers", "num_kv_heads", "head_dim", "block_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]

    @property
    def block_shape(self) -> tuple[int, int, int, int, int]:
        """Shape of one block: (layers, K/V, block_size, kv_heads, head_dim)."""
        return (self.num_layers, 2, self.block_size, self.num_kv_heads, self.head_dim)

    @property
    def block_bytes(self) -> int:
        n = self.num_layers * 2 * self.block_size * self.num_kv_heads * self.head_dim
        return n * self.torch_dtype.itemsize

    def fingerprint(self) -> str:
        """Stable 16-hex-digit id of the layout; the global index is partitioned by it."""
        canon = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.blake2b(canon, digest_size=8).hexdigest()

    def new_cache(self, num_blocks: int, device: str | torch.device = "cpu") -> torch.Tensor:
        """A zeroed cache tensor for `num_blocks` blocks in this layout."""
        return torch.zeros((num_blocks, *self.block_shape), dtype=self.torch_dtype, device=device)
