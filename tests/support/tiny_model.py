"""The tests' models: seeded random weights, no download. `SOURCE` is what test agents serve (as
`MODEL_NAME`, blocks of `BS` tokens); `tiny_model` is the named `tiny` config's engine-level model;
`small_config` is a smaller Llama shape for model-level checks, with fields replaced as a test needs."""

from typing import Any

from radixmesh.node_agent.model.config import LlamaConfig, named_config
from radixmesh.node_agent.model.llama import LlamaForCausalLM
from radixmesh.node_agent.model.source import random_source
from radixmesh.node_agent.model.weights import random_model

BS = 4
"""Tokens per KV block in the test agents and clusters."""
MODEL = named_config("tiny", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
MODEL_NAME = "tiny-test"
SOURCE = random_source(MODEL, seed=7, name=MODEL_NAME)


def tiny_model(seed: int = 0) -> LlamaForCausalLM:
    """The named `tiny` config with seeded random weights."""
    return random_model(named_config("tiny"), seed=seed)


def small_config(**kw: Any) -> LlamaConfig:
    """A 2-layer Llama of hidden size 32 (4 heads, 2 KV heads) over a 50-token vocabulary."""
    base: dict[str, Any] = {"vocab_size": 50, "hidden_size": 32, "intermediate_size": 64,
                            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                            "max_position_embeddings": 128, "bos_token_id": 0, "eos_token_id": 1}
    return LlamaConfig(**{**base, **kw})
