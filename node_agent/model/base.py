"""What the engine needs of a model: its config, its parameters (dtype, weight bytes) and one forward
over a packed batch against a tier's KV tensor. `LlamaForCausalLM` is the real one;
`model.modeled.ModeledModel` prices the forward with a profile instead of computing it."""

from collections.abc import Iterator
from typing import Protocol

import torch

from radixmesh.node_agent.model.config import LlamaConfig
from radixmesh.node_agent.model.llama import AttentionBatch


class CausalLM(Protocol):
    config: LlamaConfig
    """Vocabulary, context limit, end of sequence and the KV shape (kv_layout) the engine sizes its pool by."""

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        """The weights: their dtype is the KV's, their bytes the weights zone's."""
        ...

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, batch: AttentionBatch,
                 kv_cache: torch.Tensor, logits_indices: torch.Tensor) -> torch.Tensor:
        """Float32 logits [len(logits_indices), vocab]; writes the new tokens' KV into `kv_cache` at
        `batch.slot_mapping` (LlamaForCausalLM.forward)."""
        ...
