"""Model weights: a local Hugging Face directory (config.json + *.safetensors) or a seeded random init.

(A GGUF file loads through `gguf.load_gguf`.)

Never downloads. A seeded model draws every tensor from one CPU generator in sorted parameter-name
order, so the same (config, seed) gives bit-identical weights on every node and device, which is what
lets nodes of one layout share KV blocks.
"""

import json
import logging
import math
from pathlib import Path

import torch
from safetensors import safe_open

from radixmesh.node_agent.model.config import LlamaConfig
from radixmesh.node_agent.model.llama import LlamaForCausalLM

logger = logging.getLogger(__name__)

# HF checkpoints of older transformers versions carry RoPE buffers; they are recomputed, not loaded.
_IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)


def random_model(config: LlamaConfig, seed: int, *, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu") -> LlamaForCausalLM:
    """A model with seeded random weights: embeddings N(0, 1), linears N(0, 1/fan_in), norms 1,
    biases N(0, 1/size).

    The scale keeps activations and logits O(1), so greedy decoding has clear winners.
    """
    model = LlamaForCausalLM(config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            elif name.endswith("embed_tokens.weight"):
                param.copy_(torch.randn(param.shape, generator=gen))
            elif name.endswith(".bias"):
                param.copy_(torch.randn(param.shape, generator=gen) / math.sqrt(param.shape[0]))
            else:
                param.copy_(torch.randn(param.shape, generator=gen) / math.sqrt(param.shape[1]))
    return model.to(device=device, dtype=dtype).eval()


def load_checkpoint(directory: str | Path, *, dtype: torch.dtype = torch.float32,
                    device: str | torch.device = "cpu") -> LlamaForCausalLM:
    """Load a local HF Llama, Mistral or Qwen2 directory (one or several *.safetensors shards).

    Raises ValueError when config.json or the weights are missing, a tensor is missing, unexpected
    or of the wrong shape: a half-loaded model would serve wrong tokens silently.
    """
    path = Path(directory)
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ValueError(f"{path} has no config.json")
    config = LlamaConfig.from_hf_dict(json.loads(config_file.read_text()))
    shards = sorted(path.glob("*.safetensors"))
    if not shards:
        raise ValueError(f"{path} has no *.safetensors file")
    model = LlamaForCausalLM(config)
    expected = model.state_dict()
    if config.tie_word_embeddings:
        expected.pop("lm_head.weight")
    loaded: dict[str, torch.Tensor] = {}
    for shard in shards:
        with safe_open(str(shard), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118  (safe_open is not iterable)
                if name.endswith(_IGNORED_SUFFIXES):
                    continue
                if name not in expected:
                    raise ValueError(f"unexpected tensor {name!r} in {shard.name}")
                tensor = f.get_tensor(name)
                if tuple(tensor.shape) != tuple(expected[name].shape):
                    raise ValueError(f"{name}: shape {tuple(tensor.shape)} in {shard.name}, "
                                     f"config wants {tuple(expected[name].shape)}")
                loaded[name] = tensor
    missing = sorted(set(expected) - set(loaded))
    if missing:
        raise ValueError(f"{path} lacks {len(missing)} tensors, e.g. {missing[:3]}")
    model.load_state_dict(loaded, strict=not config.tie_word_embeddings)
    logger.info("loaded %d tensors from %d shard(s) in %s", len(loaded), len(shards), path)
    return model.to(device=device, dtype=dtype).eval()
