"""Llama-family hyperparameters, their HF `config.json` form, and the named configs.

Field names follow Hugging Face's `LlamaConfig`, so a local checkpoint's config.json maps onto
this dataclass one to one and a saved one loads in other Llama runtimes. The family covers the
model types whose decoder is Llama's up to biases and RoPE frequencies: Llama (optionally with
llama3 RoPE scaling and biases), Mistral without a sliding window, and Qwen2 (q/k/v biases).
"""

from dataclasses import dataclass, fields, replace
from typing import Any

from radixmesh.common.text.tokenizer import BYTE_VOCAB_SIZE
from radixmesh.proto.kv_layout import KVLayout
from radixmesh.proto.serve.limits import PromptLimits

ARCHITECTURES: dict[str, str] = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
}
"""The supported HF model types and their `architectures` entry."""


@dataclass(frozen=True, slots=True)
class Llama3RopeScaling:
    """Llama 3.1's RoPE frequency scaling (HF `rope_type: "llama3"`).

    Wavelengths longer than original_max_position_embeddings / low_freq_factor are stretched by
    `factor`, those shorter than original_max_position_embeddings / high_freq_factor are kept, and
    the band between is interpolated smoothly.
    """

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int

    def __post_init__(self) -> None:
        if self.factor <= 0 or self.original_max_position_embeddings <= 0:
            raise ValueError(f"rope_scaling factor and original_max_position_embeddings must be "
                             f"positive, got {self.factor}, {self.original_max_position_embeddings}")
        if not 0 < self.low_freq_factor < self.high_freq_factor:
            raise ValueError(f"rope_scaling needs 0 < low_freq_factor < high_freq_factor, got "
                             f"{self.low_freq_factor}, {self.high_freq_factor}")


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
    model_type: str = "llama"
    """One of ARCHITECTURES; "qwen2" puts biases on the q/k/v projections."""
    attention_bias: bool = False
    """Llama's flag: biases on the q/k/v/o projections."""
    mlp_bias: bool = False
    """Llama's flag: biases on the gate/up/down projections."""
    rope_scaling: Llama3RopeScaling | None = None
    """None: plain RoPE with rope_theta."""

    @property
    def qkv_bias(self) -> bool:
        """Whether q_proj, k_proj and v_proj carry biases."""
        return self.attention_bias or self.model_type == "qwen2"

    def __post_init__(self) -> None:
        if self.model_type not in ARCHITECTURES:
            raise ValueError(f"model_type {self.model_type!r} is not supported; valid: {sorted(ARCHITECTURES)}")
        if self.model_type != "llama" and (self.attention_bias or self.mlp_bias):
            raise ValueError(f"attention_bias/mlp_bias are Llama flags, not {self.model_type!r} ones")
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

    @classmethod
    def from_hf_dict(cls, raw: dict[str, Any]) -> "LlamaConfig":
        """Parse a config.json (transformers 4 or 5 form); keys this model does not use are ignored.

        Raises ValueError for an unsupported model type or architecture, a missing field, or a
        feature not implemented (RoPE other than default/llama3, an active sliding window, an
        activation other than SiLU), rather than loading something that would compute different
        outputs.
        """
        model_type = raw.get("model_type", "llama")
        if model_type not in ARCHITECTURES:
            raise ValueError(f"model_type {model_type!r} is not supported; valid: {sorted(ARCHITECTURES)}")
        for arch in raw.get("architectures") or []:
            if arch != ARCHITECTURES[model_type]:
                raise ValueError(f"architecture {arch!r} is not supported for model_type {model_type!r}; "
                                 f"valid: {sorted(ARCHITECTURES.values())}")
        if raw.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act must be 'silu', got {raw['hidden_act']!r}")
        _check_no_sliding_window(raw, model_type)
        known = {f.name for f in fields(cls)} - {"rope_scaling", "attention_bias", "mlp_bias"}
        kwargs = {k: v for k, v in raw.items() if k in known and v is not None}
        if model_type == "llama":  # Mistral and Qwen2 ignore these keys in HF too
            kwargs.update(attention_bias=bool(raw.get("attention_bias")), mlp_bias=bool(raw.get("mlp_bias")))
        theta, scaling = _parse_rope(raw)
        if theta is not None:
            kwargs["rope_theta"] = theta
        kwargs["rope_scaling"] = scaling
        if isinstance(kwargs.get("eos_token_id"), list):
            kwargs["eos_token_id"] = kwargs["eos_token_id"][0]
        try:
            return cls(**kwargs)
        except TypeError as exc:
            raise ValueError(f"config.json lacks a required field: {exc}") from exc


def _parse_rope(raw: dict[str, Any]) -> tuple[float | None, Llama3RopeScaling | None]:
    """rope_theta and the scaling of a config.json.

    transformers 4 writes `rope_theta` and `rope_scaling` ({"type" | "rope_type": ...}); 5 writes
    one `rope_parameters` dict that holds rope_theta too.
    """
    params = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    theta = raw.get("rope_theta")
    if theta is None:
        theta = params.get("rope_theta")
    kind = params.get("rope_type", params.get("type", "default"))
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError(f"partial rotary embeddings are not supported: rope_scaling {params!r}")
    if kind == "default":
        return theta, None
    if kind != "llama3":
        raise ValueError(f"rope_scaling type {kind!r} is not supported; valid: 'default', 'llama3'")
    keys = [f.name for f in fields(Llama3RopeScaling)]
    missing = [k for k in keys if k not in params]
    if missing:
        raise ValueError(f"rope_scaling llama3 lacks {missing}: {params!r}")
    return theta, Llama3RopeScaling(**{k: params[k] for k in keys})


def _check_no_sliding_window(raw: dict[str, Any], model_type: str) -> None:
    """Raise unless attention is full: no window, or one no shorter than the context."""
    window = raw.get("sliding_window")
    if model_type == "qwen2" and not raw.get("use_sliding_window", False):
        window = None  # HF's Qwen2 ignores sliding_window unless use_sliding_window is set
    if model_type == "llama":
        window = None
    context = raw.get("max_position_embeddings")
    if window is not None and (context is None or window < context):
        raise ValueError(f"sliding-window attention is not supported: sliding_window {window} is "
                         f"shorter than max_position_embeddings {context}")
    # With no active window, HF's "sliding_attention" layers attend to everything as well.
    unknown = set(raw.get("layer_types") or []) - {"full_attention", "sliding_attention"}
    if unknown:
        raise ValueError(f"layer types {sorted(unknown)} are not supported")


NAMED_CONFIGS: dict[str, LlamaConfig] = {
    # Small enough for the CPU test suite, big enough that a 1k-token prefill dominates TTFT.
    "tiny": LlamaConfig(vocab_size=BYTE_VOCAB_SIZE, hidden_size=256, intermediate_size=768,
                        num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
                        max_position_embeddings=4096),
    "llama3-8b": LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                             num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                             max_position_embeddings=8192, rope_theta=500000.0,
                             bos_token_id=128000, eos_token_id=128001),
    # Llama-3-70B's shape: what a modeled 70B profile serves (random weights of it need ~280 GB).
    "llama3-70b": LlamaConfig(vocab_size=128256, hidden_size=8192, intermediate_size=28672,
                              num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
                              max_position_embeddings=8192, rope_theta=500000.0,
                              bos_token_id=128000, eos_token_id=128001),
}


def named_config(name: str, **overrides: Any) -> LlamaConfig:
    """A named config, with fields optionally replaced; unknown names raise ValueError.

    head_dim is derived again (hidden_size // heads) unless `overrides` sets it.
    """
    if name not in NAMED_CONFIGS:
        raise ValueError(f"unknown model config {name!r}; valid: {sorted(NAMED_CONFIGS)}")
    return replace(NAMED_CONFIGS[name], **{"head_dim": 0, **overrides})
