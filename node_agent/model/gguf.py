"""Weights and config of a llama.cpp GGUF file (architecture "llama"), dequantized to torch.

Never downloads. Every tensor is dequantized with the `gguf` package's numpy reference, the same
code transformers' GGUF loader runs, so both start from bit-identical float32 weights. The
tokenizer stored in the same file is read by `tokenizer.py`, not here.
"""

import logging
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGUFReader
from gguf.quants import dequantize

from radixmesh.common.text.gguf_file import open_gguf
from radixmesh.node_agent.model.config import LlamaConfig
from radixmesh.node_agent.model.llama import LlamaForCausalLM
from radixmesh.node_agent.model.weights import file_digest

logger = logging.getLogger(__name__)

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.(\w+)\.weight")


def gguf_identity(path: str | Path) -> str:
    """A short hex digest naming a GGUF file's weights (all its bytes): the KV layout's model id."""
    return file_digest(path)[:32]


def hf_name(gguf_name: str) -> str:
    """The model's parameter name for a GGUF tensor name; ValueError for one it has no place for."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _LAYER_TENSOR.fullmatch(gguf_name)
    if m is None or m.group(2) not in _LAYER_NAMES:
        raise ValueError(f"unexpected GGUF tensor {gguf_name!r} (biases, rope_freqs and other "
                         "architectures' tensors are not supported)")
    return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}.weight"


def unpermute_rope_rows(weight: np.ndarray, n_head: int) -> np.ndarray:
    """Undo convert_hf_to_gguf's q/k row permutation, giving back HF's "rotate half" layout.

    Per head, HF orders the rows [x_0 .. x_{d/2-1}, y_0 .. y_{d/2-1}] (the two halves RoPE rotates
    together); llama.cpp wants the pairs adjacent, [x_0, y_0, x_1, y_1, ...], and the converter
    writes ``w.reshape(n_head, 2, d/2, ...).swapaxes(1, 2)``. Reading the file's rows as
    (n_head, d/2, 2) and swapping back is its exact inverse.
    """
    rows = weight.shape[0]
    assert rows % (2 * n_head) == 0, (weight.shape, n_head)
    return (weight.reshape(n_head, rows // n_head // 2, 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def _field(reader: GGUFReader, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    if field is None:
        if default is None:
            raise ValueError(f"GGUF metadata lacks {key!r}")
        return default
    return field.contents()


def config_from_gguf(reader: GGUFReader) -> LlamaConfig:
    """The LlamaConfig a GGUF's llama.* and tokenizer.ggml.* metadata describe.

    Raises ValueError for another architecture or a RoPE variant not implemented.
    """
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"GGUF architecture {arch!r} is not supported; valid: 'llama'")
    scaling = _field(reader, "llama.rope.scaling.type", "none")
    if scaling != "none":
        raise ValueError(f"GGUF rope scaling {scaling!r} is not supported")
    tensors = {t.name: t for t in reader.tensors}
    if "token_embd.weight" not in tensors:
        raise ValueError("GGUF lacks token_embd.weight")
    # GGUF shapes list the fastest-varying dimension first: [hidden, vocab].
    vocab = int(tensors["token_embd.weight"].shape[1])
    hidden = int(_field(reader, "llama.embedding_length"))
    heads = int(_field(reader, "llama.attention.head_count"))
    head_dim = int(_field(reader, "llama.attention.key_length", hidden // heads))
    if int(_field(reader, "llama.rope.dimension_count", head_dim)) != head_dim:
        raise ValueError("partial rotary embeddings (rope.dimension_count < head_dim) are not supported")
    return LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=int(_field(reader, "llama.feed_forward_length")),
        num_hidden_layers=int(_field(reader, "llama.block_count")),
        num_attention_heads=heads,
        num_key_value_heads=int(_field(reader, "llama.attention.head_count_kv", heads)),
        max_position_embeddings=int(_field(reader, "llama.context_length")),
        rms_norm_eps=float(_field(reader, "llama.attention.layer_norm_rms_epsilon")),
        rope_theta=float(_field(reader, "llama.rope.freq_base", 10000.0)),
        tie_word_embeddings="output.weight" not in tensors,
        bos_token_id=int(_field(reader, "tokenizer.ggml.bos_token_id")),
        eos_token_id=int(_field(reader, "tokenizer.ggml.eos_token_id")),
        head_dim=head_dim,
    )


def load_gguf(path: str | Path, *, dtype: torch.dtype = torch.float32,
              device: str | torch.device = "cpu") -> LlamaForCausalLM:
    """Load a GGUF Llama: config from its metadata, every tensor dequantized and renamed.

    Raises ValueError for a non-llama architecture, or a tensor that is missing, unexpected or of
    the wrong shape: a half-loaded model would serve wrong tokens silently.
    """
    reader = open_gguf(path)
    config = config_from_gguf(reader)
    model = LlamaForCausalLM(config)
    expected = model.state_dict()
    if config.tie_word_embeddings:
        expected.pop("lm_head.weight")
    loaded: dict[str, torch.Tensor] = {}
    for tensor in reader.tensors:
        name = hf_name(tensor.name)
        weight = dequantize(tensor.data, tensor.tensor_type)
        if name.endswith("q_proj.weight"):
            weight = unpermute_rope_rows(weight, config.num_attention_heads)
        elif name.endswith("k_proj.weight"):
            weight = unpermute_rope_rows(weight, config.num_key_value_heads)
        if tuple(weight.shape) != tuple(expected[name].shape):
            raise ValueError(f"{tensor.name}: shape {tuple(weight.shape)}, config wants "
                             f"{tuple(expected[name].shape)}")
        loaded[name] = torch.from_numpy(np.array(weight, dtype=np.float32))  # a copy: the file is mmapped read-only
    missing = sorted(set(expected) - set(loaded))
    if missing:
        raise ValueError(f"{path} lacks {len(missing)} tensors, e.g. {missing[:3]}")
    model.load_state_dict(loaded, strict=not config.tie_word_embeddings)
    logger.info("loaded %d GGUF tensors from %s", len(loaded), path)
    return model.to(device=device, dtype=dtype).eval()
