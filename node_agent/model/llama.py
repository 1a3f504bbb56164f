"""Llama decoder whose attention reads and writes the paged KV pool through radixmesh.kernels.

Module and parameter names mirror Hugging Face's `LlamaForCausalLM` (``model.layers.0.self_attn.q_proj
.weight`` ...), so a local HF checkpoint's state dict loads without renaming.

One forward pass runs a packed batch of new tokens (``T`` of them, from ``B`` sequences): every
sequence's new tokens sit after the tokens already in its blocks. The pass writes their K/V into the
slots named by `AttentionBatch.slot_mapping`, then attends over prefix + new tokens, causally: one-token
sequences (decodes, first in the batch) through the decode kernel, the others through the prefill one.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn

from radixmesh.kernels import ops as kernels
from radixmesh.node_agent.model.config import Llama3RopeScaling, LlamaConfig


class SeqChunk(NamedTuple):
    """One sequence's share of a forward pass: `num_new` tokens after `prefix_len` cached ones."""

    block_ids: Sequence[int]
    prefix_len: int
    num_new: int


class PrefillChunks(NamedTuple):
    """The prefill sequences of a batch (its sequences from `num_decodes` on), rows counted from the
    first prefill row."""

    block_tables: torch.Tensor
    prefix_lens: torch.Tensor
    cu_seqlens: torch.Tensor


@dataclass(frozen=True, slots=True)
class AttentionBatch:
    """Where the new tokens of one forward pass come from and where their K/V go.

    Sequence i owns packed tokens ``cu_seqlens[i]:cu_seqlens[i+1]``; it already has
    ``prefix_lens[i]`` tokens in its blocks ``block_tables[i]`` (rows padded with 0). Decodes come
    first: the leading sequences with one new token each run the decode kernel, the rest the prefill
    kernel, in the same forward (the linear layers see all T tokens at once)::

        packed rows: [ decode 0 | ... | decode D-1 | chunk D ... | chunk D+1 ... | ... ]
                       decode attention, rows [0, D)  prefill attention, rows [D, T)
    """

    num_decodes: int
    """D: the leading sequences with exactly one new token."""
    slot_mapping: torch.Tensor
    """[T] int64: block * block_size + offset of each new token's K/V."""
    block_tables: torch.Tensor
    """[B, max_blocks] int32."""
    prefix_lens: torch.Tensor
    """[B] int32: tokens already cached before this pass."""
    cu_seqlens: torch.Tensor
    """[B + 1] int32: cumulative new-token counts."""
    prefill: PrefillChunks | None
    """Sequences D .. B-1, None when every sequence decodes."""

    @property
    def is_decode(self) -> bool:
        """Every sequence has exactly one new token: only the decode kernel runs."""
        return self.prefill is None

    @property
    def seq_lens(self) -> torch.Tensor:
        """[B] int32: tokens per sequence after this pass."""
        return self.prefix_lens + (self.cu_seqlens[1:] - self.cu_seqlens[:-1])

    @classmethod
    def build(cls, chunks: Sequence[SeqChunk], block_size: int,
              device: str | torch.device = "cpu") -> tuple["AttentionBatch", torch.Tensor]:
        """The batch for `chunks` and the positions [T] of its packed tokens, in the order given
        (put one-token chunks first: only the leading ones run as decodes).

        Each chunk's block table must already cover prefix_len + num_new tokens.
        """
        assert chunks, "empty batch"
        positions: list[int] = []
        slots: list[int] = []
        cu = [0]
        width = max(len(c.block_ids) for c in chunks)
        for c in chunks:
            assert len(c.block_ids) * block_size >= c.prefix_len + c.num_new, (c, block_size)
            pos = range(c.prefix_len, c.prefix_len + c.num_new)
            positions.extend(pos)
            slots.extend(c.block_ids[p // block_size] * block_size + p % block_size for p in pos)
            cu.append(cu[-1] + c.num_new)
        tables = [list(c.block_ids) + [0] * (width - len(c.block_ids)) for c in chunks]
        d = next((i for i, c in enumerate(chunks) if c.num_new != 1), len(chunks))

        def i32(values: Sequence[int] | list[list[int]]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int32, device=device)

        prefix_lens = i32([c.prefix_len for c in chunks])
        block_tables = i32(tables)
        prefill = None if d == len(chunks) else PrefillChunks(
            block_tables[d:], prefix_lens[d:], i32([n - cu[d] for n in cu[d:]]))
        batch = cls(
            num_decodes=d,
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
            block_tables=block_tables,
            prefix_lens=prefix_lens,
            cu_seqlens=i32(cu),
            prefill=prefill,
        )
        return batch, torch.tensor(positions, dtype=torch.int64, device=device)

    def plan_decode(self, cache_k: torch.Tensor, num_heads: int) -> kernels.DecodePlan | None:
        """The decode kernel's plan for sequences 0 .. D-1 (once per forward), None without decodes."""
        d = self.num_decodes
        if d == 0:
            return None
        return kernels.plan_decode(self.block_tables[:d], self.prefix_lens[:d] + 1, cache_k, num_heads)


class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed in float32 as Llama does."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rope_inv_freq(head_dim: int, theta: float, scaling: Llama3RopeScaling | None = None,
                  device: str | torch.device = "cpu") -> torch.Tensor:
    """The [head_dim / 2] float32 rotation frequencies, op for op as transformers computes them."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim))
    if scaling is None:
        return inv_freq
    # transformers' _compute_llama3_parameters, in the same float32 operations and order.
    low_freq_wavelen = scaling.original_max_position_embeddings / scaling.low_freq_factor
    high_freq_wavelen = scaling.original_max_position_embeddings / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = ((scaling.original_max_position_embeddings / wavelen - scaling.low_freq_factor)
              / (scaling.high_freq_factor - scaling.low_freq_factor))
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables [T, head_dim] for the HF "rotate half" RoPE convention, in float32."""
    freqs = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [T, H, D] by position; cos/sin are [T, D]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x * cos[:, None, :] + rotated * sin[:, None, :]).to(x.dtype)


class LlamaAttention(nn.Module):
    """Grouped-query attention over the paged cache."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.scale = self.head_dim**-0.5
        h, d = config.hidden_size, config.head_dim
        self.q_proj = nn.Linear(h, self.num_heads * d, bias=config.qkv_bias)
        self.k_proj = nn.Linear(h, self.num_kv_heads * d, bias=config.qkv_bias)
        self.v_proj = nn.Linear(h, self.num_kv_heads * d, bias=config.qkv_bias)
        self.o_proj = nn.Linear(self.num_heads * d, h, bias=config.attention_bias)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, batch: AttentionBatch,
                decode: kernels.DecodePlan | None, cache_k: torch.Tensor, cache_v: torch.Tensor) -> torch.Tensor:
        t = x.shape[0]
        q = apply_rope(self.q_proj(x).view(t, self.num_heads, self.head_dim), cos, sin)
        k = apply_rope(self.k_proj(x).view(t, self.num_kv_heads, self.head_dim), cos, sin)
        v = self.v_proj(x).view(t, self.num_kv_heads, self.head_dim)
        kernels.write_kv(k, v, cache_k, cache_v, batch.slot_mapping)
        out = torch.empty_like(q)
        d = batch.num_decodes  # rows [0, d) decode, [d, t) prefill (AttentionBatch)
        if decode is not None:
            kernels.paged_decode_attention(q[:d], cache_k, cache_v, decode, self.scale, out=out[:d])
        if (p := batch.prefill) is not None:
            kernels.paged_prefill_attention(q[d:], k[d:], v[d:], cache_k, cache_v, p.block_tables, p.prefix_lens,
                                            p.cu_seqlens, self.scale, out=out[d:])
        return self.o_proj(out.view(t, self.num_heads * self.head_dim))


class LlamaMLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    """Pre-norm residual block: attention then MLP."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LlamaAttention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = LlamaMLP(config)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, batch: AttentionBatch,
                decode: kernels.DecodePlan | None, cache_k: torch.Tensor, cache_v: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, batch, decode, cache_k, cache_v)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    """Embedding, decoder layers, final norm (HF's `model.` prefix)."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    """The full model: `forward` runs one packed batch against a tier's KV cache tensor."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, batch: AttentionBatch,
                kv_cache: torch.Tensor, logits_indices: torch.Tensor) -> torch.Tensor:
        """Float32 logits [len(logits_indices), vocab] of the packed tokens at `logits_indices`.

        `kv_cache` is ``[num_blocks, layers, 2, block_size, kv_heads, head_dim]`` (KVLayout); this
        pass writes the new tokens' K/V into it, so those slots must belong to the caller.
        """
        cfg = self.config
        inv_freq = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, positions.device)
        cos, sin = rope_cos_sin(positions, inv_freq)
        # Per step, not per layer: every layer's cache view has the same shape and strides.
        decode = batch.plan_decode(kv_cache[:, 0, 0], cfg.num_attention_heads)
        x = self.model.embed_tokens(input_ids)
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, batch, decode, kv_cache[:, i, 0], kv_cache[:, i, 1])
        # Only the rows that will be sampled go through the (vocab-wide) head.
        x = self.model.norm(x[logits_indices])
        return self.lm_head(x).float()
