"""Llama-architecture hyperparameters, their HF `config.json` form, and the named configs.

Field names follow Hugging Face's `LlamaConfig`, so a local checkpoint's config.json maps onto
this dataclass one to one and a saved one loads in other Llama runtimes.
"""

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from radixmesh.proto.kv_layout import KVLayout
from radixmesh.proto.serve.limits import PromptLimits

BYTE_VOCAB_SIZE = 258
"""256 byte values, then BOS (256) and EOS (257): the byte tokenizer's vocabulary."""


@dataclass(frozen=True, slots=True)
class LlamaConfig:
    """Shape of a Llama decoder (RMSNorm, RoPE, grouped-query attention, SwiGLU MLP)."""

    vocab_size: int
    hidden_size: int
    """Width of the residual stream."""
    intermediate_size: int
    """Width of the SwiGLU MLP."""
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    """Must divide num_attention_heads (grouped-query attention)."""
    max_position_embeddings: int
    """Context limit: prompt plus generated tokens."""
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = False
    """True: the LM head reuses the embedding matrix (no `lm_head.weight` in the checkpoint)."""
    bos_token_id: int = 256
    eos_token_id: int = 257
    head_dim: int = 0
    """0 means hidden_size // num_attention_heads."""

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "max_position_embeddings"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_key_value_heads ({self.num_key_value_heads}) must divide "
                             f"num_attention_heads ({self.num_attention_heads})")
        if self.head_dim == 0:
            if self.hidden_size % self.num_attention_heads:
                raise ValueError("hidden_size must be a multiple of num_attention_heads when head_dim is 0")
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        for name in ("bos_token_id", "eos_token_id"):
            if not 0 <= getattr(self, name) < self.vocab_size:
                raise ValueError(f"{name} must be in [0, {self.vocab_size}), got {getattr(self, name)}")

    def kv_layout(self, model_id: str, block_size: int, dtype: str = "float32") -> KVLayout:
        """The KV cache layout of this model; `model_id` names the weights (e.g. the seed)."""
        return KVLayout(model_id=model_id, num_layers=self.num_hidden_layers,
                        num_kv_heads=self.num_key_value_heads, head_dim=self.head_dim,
                        dtype=dtype, block_size=block_size)

    def prompt_limits(self) -> PromptLimits:
        """What a prompt for this model must satisfy (its vocabulary and context length)."""
        return PromptLimits(self.vocab_size, self.max_position_embeddings)

    def to_hf_dict(self) -> dict[str, Any]:
        """The config.json content of a Hugging Face Llama checkpoint."""
        return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **asdict(self)}

    @classmethod
    def from_hf_dict(cls, raw: dict[str, Any]) -> "LlamaConfig":
        """Parse a config.json; keys this model does not use (dtype, attention_bias=false...) are ignored.

        Raises ValueError for a non-Llama model type, a missing field, or features not implemented
        (biases, RoPE scaling), rather than loading something that would compute different outputs.
        """
        if raw.get("model_type", "llama") != "llama":
            raise ValueError(f"model_type must be 'llama', got {raw.get('model_type')!r}")
        if raw.get("attention_bias") or raw.get("mlp_bias"):
            raise ValueError("attention/MLP biases are not supported")
        if raw.get("rope_scaling"):
            raise ValueError(f"rope_scaling is not supported, got {raw['rope_scaling']!r}")
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in raw.items() if k in known and v is not None}
        if isinstance(kwargs.get("eos_token_id"), list):
            kwargs["eos_token_id"] = kwargs["eos_token_id"][0]
        try:
            return cls(**kwargs)
        except TypeError as exc:
            raise ValueError(f"config.json lacks a required field: {exc}") from exc


NAMED_CONFIGS: dict[str, LlamaConfig] = {
    # Small enough for the CPU test suite, big enough that a 1k-token prefill dominates TTFT.
    "tiny": LlamaConfig(vocab_size=BYTE_VOCAB_SIZE, hidden_size=256, intermediate_size=768,
                        num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
                        max_position_embeddings=4096),
    "llama3-8b": LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                             num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                             max_position_embeddings=8192, rope_theta=500000.0,
                             bos_token_id=128000, eos_token_id=128001),
}
DEFAULT_CONFIG = "tiny"


def named_config(name: str, **overrides: Any) -> LlamaConfig:
    """A named config, with fields optionally replaced; unknown names raise ValueError.

    head_dim is derived again (hidden_size // heads) unless `overrides` sets it.
    """
    if name not in NAMED_CONFIGS:
        raise ValueError(f"unknown model config {name!r}; valid: {sorted(NAMED_CONFIGS)}")
    return replace(NAMED_CONFIGS[name], **{"head_dim": 0, **overrides})
