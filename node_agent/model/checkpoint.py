"""What a checkpoint is, read without loading its weights (so without torch): the digest that names
it in the KV layout, and the shape a GGUF's metadata describes. The launcher, the CLI and the router
read these; the loaders (weights.py, gguf.py) build the model."""

import hashlib
from pathlib import Path
from typing import Any

from gguf import GGUFReader

from radixmesh.node_agent.model.config import LlamaConfig

_DIGEST_CHARS = 32
"""Hex characters of an identity: 128 bits, so two different weight sets never collide in practice."""


def file_digest(path: str | Path, chunk_bytes: int = 1 << 22) -> str:
    """sha256 hex digest of a file's bytes, read in chunks (weights can be many GB)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(chunk_bytes):
            h.update(chunk)
    return h.hexdigest()


def checkpoint_identity(directory: str | Path) -> str:
    """A short hex digest naming a checkpoint directory's weights: the KV layout's model id.

    Covers config.json and every *.safetensors file (by name, in sorted order), so checkpoints
    that differ in any weight or hyperparameter never share KV blocks. Reads every byte.
    """
    path = Path(directory)
    h = hashlib.sha256(b"radixmesh-checkpoint-v1\0")
    for file in [path / "config.json", *sorted(path.glob("*.safetensors"))]:
        if not file.is_file():
            raise ValueError(f"{path} has no {file.name}")
        h.update(f"{file.name}\0{file_digest(file)}\0".encode())
    return h.hexdigest()[:_DIGEST_CHARS]


def gguf_identity(path: str | Path) -> str:
    """A short hex digest naming a GGUF file's weights (all its bytes): the KV layout's model id."""
    return file_digest(path)[:_DIGEST_CHARS]


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
