"""Weights: seeded init is reproducible; a hand-written HF checkpoint directory loads exactly."""

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from radixmesh.common.text.tokenizer import ByteTokenizer, HFTokenizer, load_tokenizer
from radixmesh.node_agent.model.checkpoint import checkpoint_identity
from radixmesh.node_agent.model.config import ARCHITECTURES, Llama3RopeScaling, LlamaConfig
from radixmesh.node_agent.model.llama import AttentionBatch, LlamaForCausalLM, SeqChunk
from radixmesh.node_agent.model.weights import load_checkpoint, random_model
from tests.support.checkpoint import hf_config, save_checkpoint
from tests.support.tiny_model import small_config

CFG = small_config(vocab_size=40, intermediate_size=48, max_position_embeddings=64)


def greedy(model: LlamaForCausalLM, prompt: list[int], steps: int) -> tuple[list[int], torch.Tensor]:
    """Greedy tokens and their logits, prefill then one-token decodes on a private cache."""
    kv = model.config.kv_layout("t", 4).new_cache(8)
    table = list(range(8))
    tokens = list(prompt)
    all_logits = []
    done = 0
    for _ in range(steps):
        n = len(tokens) - done
        batch, pos = AttentionBatch.build([SeqChunk(table, done, n)], 4)
        logits = model(torch.tensor(tokens[done:]), pos, batch, kv, torch.tensor([n - 1]))[0]
        done = len(tokens)
        all_logits.append(logits)
        tokens.append(int(logits.argmax()))
    return tokens[len(prompt):], torch.stack(all_logits)


def test_same_seed_same_weights_other_seed_differs() -> None:
    a, b, c = random_model(CFG, 7), random_model(CFG, 7), random_model(CFG, 8)
    for (name, pa), pb, pc in zip(a.state_dict().items(), b.state_dict().values(), c.state_dict().values()):
        assert torch.equal(pa, pb), name
        if not name.endswith("norm.weight"):
            assert not torch.equal(pa, pc), name


def test_hand_written_hf_checkpoint_loads_and_generates_like_the_in_memory_model(tmp_path: Path) -> None:
    source = random_model(CFG, 3)
    state = source.state_dict()
    names = sorted(state)
    # Two shards plus the index file and a stale RoPE buffer, the way HF writes large checkpoints.
    half = len(names) // 2
    save_file({n: state[n].clone() for n in names[:half]}, str(tmp_path / "model-00001-of-00002.safetensors"))
    rest = {n: state[n].clone() for n in names[half:]}
    rest["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(4)
    save_file(rest, str(tmp_path / "model-00002-of-00002.safetensors"))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {}}))
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 32,
              "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "vocab_size": 40, "max_position_embeddings": 64,
              "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "bos_token_id": 0, "eos_token_id": [1],
              "torch_dtype": "float32", "attention_bias": False, "hidden_act": "silu"}
    (tmp_path / "config.json").write_text(json.dumps(config))

    loaded = load_checkpoint(tmp_path)
    assert loaded.config == CFG
    got, got_logits = greedy(loaded, [5, 6, 7, 8, 9], 6)
    want, want_logits = greedy(source, [5, 6, 7, 8, 9], 6)
    assert got == want
    assert torch.equal(got_logits, want_logits)


def test_save_then_load_round_trips_tied_model(tmp_path: Path) -> None:
    model = random_model(replace(CFG, tie_word_embeddings=True, num_hidden_layers=1), 2)
    save_checkpoint(model, tmp_path)
    loaded = load_checkpoint(tmp_path)
    assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, loaded.state_dict()[name]), name


def test_bad_checkpoints_raise_value_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="config.json"):
        load_checkpoint(tmp_path)
    save_checkpoint(random_model(CFG, 1), tmp_path)
    state = random_model(CFG, 1).state_dict()
    state.pop("model.norm.weight")
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="lacks 1 tensors"):
        load_checkpoint(tmp_path)
    state["model.norm.weight"] = torch.ones(31)
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="shape"):
        load_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**hf_config(CFG), "rope_scaling": {"type": "llama3"}}))
    with pytest.raises(ValueError, match="rope_scaling"):
        load_checkpoint(tmp_path)


def test_byte_tokenizer_round_trips_utf8() -> None:
    tok = load_tokenizer()
    text = "héllo, wörld ✓"
    ids = tok.encode(text)
    assert max(ids) < 256 and tok.decode(ids + [257]) == text
    assert isinstance(tok, ByteTokenizer) and tok.eos_token_id == 257
    with pytest.raises(ValueError, match="outside the byte vocabulary"):
        tok.decode([300])


def test_local_hf_tokenizer_json(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "</s>": 1, "hello": 2, "world": 3}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    hf = load_tokenizer(tmp_path, eos_token="</s>")
    assert isinstance(hf, HFTokenizer)
    assert hf.encode("hello world") == [2, 3] and hf.eos_token_id == 1 and hf.vocab_size == 4
    assert hf.decode([2, 3]) == "hello world"
    with pytest.raises(ValueError, match="not in"):
        HFTokenizer.from_pretrained_dir(tmp_path, eos_token="<eos>")


@pytest.mark.parametrize("family", [
    {"rope_scaling": Llama3RopeScaling(8.0, 1.0, 4.0, 16), "attention_bias": True, "mlp_bias": True},
    {"model_type": "qwen2"},
    {"model_type": "mistral"},
])
def test_save_then_load_round_trips_family_configs(tmp_path: Path, family: dict[str, Any]) -> None:
    model = random_model(replace(CFG, **family), 4)
    save_checkpoint(model, tmp_path)
    loaded = load_checkpoint(tmp_path)
    assert loaded.config == model.config
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == [
        ARCHITECTURES[model.config.model_type]]
    got, _ = greedy(loaded, [5, 6, 7], 4)
    assert got == greedy(model, [5, 6, 7], 4)[0]
    before = checkpoint_identity(tmp_path)
    assert checkpoint_identity(tmp_path) == before
    save_checkpoint(random_model(replace(CFG, **family), 5), tmp_path)
    assert checkpoint_identity(tmp_path) != before


def test_transformers5_rope_parameters_carry_rope_theta() -> None:
    raw = {**hf_config(CFG), "rope_theta": None, "rope_scaling": None,
           "rope_parameters": {"rope_theta": 5e5, "rope_type": "default"}}
    assert LlamaConfig.from_hf_dict(raw) == replace(CFG, rope_theta=5e5)
