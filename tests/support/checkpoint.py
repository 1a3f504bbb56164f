"""A model written as a Hugging Face checkpoint directory, for the tests that load one."""

import json
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from safetensors.torch import save_file

from radixmesh.node_agent.model.config import ARCHITECTURES, LlamaConfig
from radixmesh.node_agent.model.llama import LlamaForCausalLM


def hf_config(config: LlamaConfig) -> dict[str, Any]:
    """The config.json content of the matching Hugging Face checkpoint (LlamaConfig.from_hf_dict's inverse)."""
    raw = {f.name: getattr(config, f.name) for f in fields(config)}
    raw["rope_scaling"] = {"rope_type": "llama3", **asdict(config.rope_scaling)} if config.rope_scaling else None
    if config.model_type != "llama":  # HF has these flags on Llama only
        del raw["attention_bias"], raw["mlp_bias"]
    return {"architectures": [ARCHITECTURES[config.model_type]], **raw}


def save_checkpoint(model: LlamaForCausalLM, directory: str | Path) -> None:
    """Write config.json and model.safetensors (HF names; a tied LM head is not stored twice)."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    dtype_name = str(next(model.parameters()).dtype).removeprefix("torch.")
    config = {**hf_config(model.config), "torch_dtype": dtype_name}
    (path / "config.json").write_text(json.dumps(config, indent=2))
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight")
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
