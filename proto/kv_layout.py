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
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

KV_DTYPES = {"float32": 4, "float16": 2, "bfloat16": 2}
"""The KV precisions a layout may name, and the bytes of one element of each."""


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
        if self.dtype not in KV_DTYPES:
            raise ValueError(f"dtype must be one of {sorted(KV_DTYPES)}, got {self.dtype!r}")
        for name in ("num_layers", "num_kv_heads", "head_dim", "block_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")

    @property
    def torch_dtype(self) -> "torch.dtype":
        # torch is imported where a tensor is made, not with the module: the router, the metadata
        # service and the CLI read layouts (fingerprints, block bytes) and never load torch.
        import torch

        dtype: torch.dtype = getattr(torch, self.dtype)
        return dtype

    @property
    def block_shape(self) -> tuple[int, int, int, int, int]:
        """Shape of one block: (layers, K/V, block_size, kv_heads, head_dim)."""
        return (self.num_layers, 2, self.block_size, self.num_kv_heads, self.head_dim)

    @property
    def block_bytes(self) -> int:
        n = self.num_layers * 2 * self.block_size * self.num_kv_heads * self.head_dim
        return n * KV_DTYPES[self.dtype]

    def fingerprint(self) -> str:
        """Stable 16-hex-digit id of the layout; the global index is partitioned by it."""
        canon = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.blake2b(canon, digest_size=8).hexdigest()

    def new_cache(self, num_blocks: int, device: "str | torch.device" = "cpu") -> "torch.Tensor":
        """A zeroed cache tensor for `num_blocks` blocks in this layout."""
        import torch  # as in torch_dtype

        return torch.zeros((num_blocks, *self.block_shape), dtype=self.torch_dtype, device=device)
