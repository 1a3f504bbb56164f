"""The paged Llama model against a dense reference written from the Llama equations."""


import pytest
import torch

from radixmesh.node_agent.model.config import named_config
from radixmesh.node_agent.model.llama import AttentionBatch, LlamaForCausalLM, SeqChunk
from radixmesh.node_agent.model.weights import random_model
from tests.support.tiny_model import small_config

BS = 4


def dense_logits(model: LlamaForCausalLM, tokens: list[int]) -> torch.Tensor:
    """Logits at every position, by plain causal softmax attention over the whole sequence."""
    cfg = model.config
    sd = model.state_dict()
    t = len(tokens)
    d = cfg.head_dim
    x = sd["model.embed_tokens.weight"][torch.tensor(tokens)]
    pos = torch.arange(t, dtype=torch.float32)
    inv = 1.0 / cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    ang = torch.cat([pos[:, None] * inv] * 2, dim=-1)

    def rope(v: torch.Tensor) -> torch.Tensor:
        rot = torch.cat((-v[..., d // 2:], v[..., : d // 2]), dim=-1)
        return v * ang.cos()[:, None] + rot * ang.sin()[:, None]

    def norm(v: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return w * v / torch.sqrt(v.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps)

    group = cfg.num_attention_heads // cfg.num_key_value_heads
    mask = torch.ones(t, t).tril().bool()
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        h = norm(x, sd[p + "input_layernorm.weight"])
        q = rope((h @ sd[p + "self_attn.q_proj.weight"].T).view(t, -1, d))
        k = rope((h @ sd[p + "self_attn.k_proj.weight"].T).view(t, -1, d)).repeat_interleave(group, 1)
        v = (h @ sd[p + "self_attn.v_proj.weight"].T).view(t, -1, d).repeat_interleave(group, 1)
        s = torch.einsum("qhd,khd->hqk", q, k) / d**0.5
        a = torch.einsum("hqk,khd->qhd", s.masked_fill(~mask, float("-inf")).softmax(-1), v)
        x = x + a.reshape(t, -1) @ sd[p + "self_attn.o_proj.weight"].T
        h = norm(x, sd[p + "post_attention_layernorm.weight"])
        gate = h @ sd[p + "mlp.gate_proj.weight"].T
        x = x + (torch.nn.functional.silu(gate) * (h @ sd[p + "mlp.up_proj.weight"].T)) @ sd[
            p + "mlp.down_proj.weight"].T
    return norm(x, sd["model.norm.weight"]) @ sd["lm_head.weight"].T


def paged_logits(model: LlamaForCausalLM, tokens: list[int], chunks: list[int],
                 block_ids: list[int], num_blocks: int) -> torch.Tensor:
    """Run `tokens` in chunks of the given sizes through the paged cache; logits of every token."""
    cfg = model.config
    kv = cfg.kv_layout("t", BS).new_cache(num_blocks)
    out = []
    done = 0
    for n in chunks:
        batch, positions = AttentionBatch.build([SeqChunk(block_ids, done, n)], BS)
        ids = torch.tensor(tokens[done: done + n])
        out.append(model(ids, positions, batch, kv, torch.arange(n)))
        done += n
    return torch.cat(out)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_prefill_matches_dense_reference(kv_heads: int) -> None:
    model = random_model(small_config(num_key_value_heads=kv_heads), seed=1)
    tokens = torch.randint(0, 50, (11,), generator=torch.Generator().manual_seed(2)).tolist()
    # Scattered, out-of-order blocks: the model must follow the block table, not assume contiguity.
    got = paged_logits(model, tokens, [11], [5, 2, 7], num_blocks=8)
    assert rel_err(got, dense_logits(model, tokens)) < 1e-5


def test_chunked_prefill_then_decode_matches_dense_reference() -> None:
    model = random_model(small_config(), seed=3)
    tokens = torch.randint(0, 50, (14,), generator=torch.Generator().manual_seed(4)).tolist()
    got = paged_logits(model, tokens, [3, 6, 1, 1, 3], [4, 0, 6, 1], num_blocks=7)
    assert rel_err(got, dense_logits(model, tokens)) < 1e-5


def test_batched_decode_of_two_sequences_matches_each_alone() -> None:
    model = random_model(small_config(), seed=5)
    cfg = model.config
    kv = cfg.kv_layout("t", BS).new_cache(8)
    a, b = [3, 4, 5, 6, 7], [9, 8, 7]
    ta, tb = [0, 1], [2]
    batch, pos = AttentionBatch.build([SeqChunk(ta, 0, 5), SeqChunk(tb, 0, 3)], BS)
    assert not batch.is_decode
    prefill = model(torch.tensor(a + b), pos, batch, kv, torch.tensor([4, 7]))
    batch, pos = AttentionBatch.build([SeqChunk(ta, 5, 1), SeqChunk(tb, 3, 1)], BS)
    assert batch.is_decode
    decode = model(torch.tensor([11, 12]), pos, batch, kv, torch.arange(2))
    assert rel_err(prefill[0], dense_logits(model, a)[-1]) < 1e-5
    assert rel_err(prefill[1], dense_logits(model, b)[-1]) < 1e-5
    assert rel_err(decode[0], dense_logits(model, a + [11])[-1]) < 1e-5
    assert rel_err(decode[1], dense_logits(model, b + [12])[-1]) < 1e-5


def test_tied_embeddings_share_one_matrix() -> None:
    model = random_model(small_config(tie_word_embeddings=True), seed=0)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    tokens = [2, 3, 4, 5, 6]
    assert rel_err(paged_logits(model, tokens, [5], [0, 1], 2), dense_logits(model, tokens)) < 1e-5


def test_config_validation_names_the_field() -> None:
    with pytest.raises(ValueError, match="num_key_value_heads"):
        small_config(num_key_value_heads=3)
    with pytest.raises(ValueError, match="hidden_size"):
        small_config(hidden_size=0)
    with pytest.raises(ValueError, match="unknown model config"):
        named_config("gpt-9")
    assert named_config("llama3-8b").head_dim == 128
    assert named_config("tiny").kv_layout("m", 16).num_kv_heads == 4
    assert named_config("tiny", hidden_size=512).head_dim == 64


def test_a_mixed_batch_of_decodes_and_prefill_chunks_matches_dense_reference() -> None:
    # One forward: sequence a decodes (one new token), b prefills a chunk over a cached prefix, c its
    # whole prompt; decodes first, as the engine orders them.
    model = random_model(small_config(), seed=6)
    kv = model.config.kv_layout("t", BS).new_cache(10)
    a, b, c = [3, 4, 5, 6, 7], [9, 8, 7, 6, 5, 4], [11, 12, 13]
    ta, tb, tc = [0, 5], [7, 2], [9]
    batch, pos = AttentionBatch.build([SeqChunk(ta, 0, 4), SeqChunk(tb, 0, 2)], BS)
    model(torch.tensor(a[:4] + b[:2]), pos, batch, kv, torch.tensor([3, 5]))
    batch, pos = AttentionBatch.build([SeqChunk(ta, 4, 1), SeqChunk(tb, 2, 4), SeqChunk(tc, 0, 3)], BS)
    assert batch.num_decodes == 1 and not batch.is_decode
    got = model(torch.tensor(a[4:] + b[2:] + c), pos, batch, kv, torch.tensor([0, 4, 7]))
    assert rel_err(got[0], dense_logits(model, a)[-1]) < 1e-5
    assert rel_err(got[1], dense_logits(model, b)[-1]) < 1e-5
    assert rel_err(got[2], dense_logits(model, c)[-1]) < 1e-5


def test_only_leading_one_token_chunks_run_as_decodes() -> None:
    # [decode, decode, prefill, one-token chunk after it]: the last runs in the prefill kernel.
    chunks = [SeqChunk([0], 2, 1), SeqChunk([1], 3, 1), SeqChunk([2, 3], 1, 5), SeqChunk([4], 0, 1)]
    batch, _ = AttentionBatch.build(chunks, BS)
    assert batch.num_decodes == 2
    assert batch.prefill is not None
    assert batch.prefill.cu_seqlens.tolist() == [0, 5, 6]
    assert batch.prefill.prefix_lens.tolist() == [1, 0]
    assert batch.prefill.block_tables.tolist() == [[2, 3], [4, 0]]
    assert AttentionBatch.build(chunks[:2], BS)[0].is_decode
    assert AttentionBatch.build(chunks[2:], BS)[0].num_decodes == 0
