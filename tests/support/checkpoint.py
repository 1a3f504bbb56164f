"""A model written as a Hugging Face checkpoint directory, for the tests that load one."""

import json
from pathlib import Path

from safetensors.torch import save_file

from radixmesh.node_agent.model.llama import LlamaForCausalLM


def save_checkpoint(model: LlamaForCausalLM, directory: str | Path) -> None:
    """Write config.json and model.safetensors (HF names; a tied LM head is not stored twice)."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    dtype_name = str(next(model.parameters()).dtype).removeprefix("torch.")
    config = {**model.config.to_hf_dict(), "torch_dtype": dtype_name}
    (path / "config.json").write_text(json.dumps(config, indent=2))
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight")
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
