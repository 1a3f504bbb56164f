"""Weights and config of a llama.cpp GGUF file (architecture "llama"), dequantized to torch.

Never downloads. Every tensor is dequantized with the `gguf` package's numpy reference, the same
code transformers' GGUF loader runs, so both start from bit-identical float32 weights. The
tokenizer stored in the same file is read by `tokenizer.py`, not here.
"""

import logging
import re
from pathlib import Path

import numpy as np
import torch
from gguf.quants import dequantize

from radixmesh.common.text.gguf_file import open_gguf
from radixmesh.node_agent.model.checkpoint import config_from_gguf
from radixmesh.node_agent.model.llama import LlamaForCausalLM

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
