"""ModeledModel: the engine's model with the forward replaced by a time model (model.base.CausalLM).

Its KV is the running hash of the tokens so far, one 64-bit state per token stored as four 16-bit
limbs in float32 (exact), in a layout of one layer and one head of 4: 32 bytes a token instead of the
profile's kv_bytes_per_token (128 KiB for Llama-3-8B: a scale of 1/4096). The next token is a function
of the state at the sequence's last position, so:

- output tokens are a seeded function of the prompt (and the tokens generated so far) alone: the same
  request gives the same tokens on any agent, whatever it had cached, pulled or recomputed;
- cached, pulled and recomputed KV are checked like real KV: a block that arrived wrong changes the
  output, so the cluster's correctness tests still mean something.

The forward then waits until the profile's time for the step (time_model), divided by `speedup`,
has passed since it began: the engine thread is busy for that long, as on the modeled hardware.
"""

import time
from collections.abc import Callable
from dataclasses import replace

import torch
from torch import nn

from radixmesh.node_agent.model.config import LlamaConfig
from radixmesh.node_agent.model.llama import AttentionBatch
from radixmesh.node_agent.model.modeled.time_model import PrefillChunk, StepTimeModel

HASH_LIMBS = 4
"""16-bit limbs of a token's 64-bit state: its head_dim."""
_MASK = (1 << 64) - 1
_LIMB = 0xFFFF
PEAK_LOGIT = 100.0
"""The chosen token's logit (all others 0): any temperature and top-p still draw it (its probability
is within vocab * e^-100 / T of 1)."""


def modeled_config(config: LlamaConfig) -> LlamaConfig:
    """`config` (vocabulary, context, eos: what requests see) with the KV shape of the token hash."""
    return replace(config, num_hidden_layers=1, num_attention_heads=1, num_key_value_heads=1,
                   head_dim=HASH_LIMBS)


def mix(x: int) -> int:
    """splitmix64's finalizer: a bijection of 64-bit ints that scatters every input bit."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def chain(state: int, tokens: list[int]) -> list[int]:
    """The states after each of `tokens`, from `state` (the one before the first)."""
    out = []
    for t in tokens:
        state = mix(((state ^ t) + 0x9E3779B97F4A7C15) & _MASK)
        out.append(state)
    return out


class ModeledModel(nn.Module):
    """A forward that costs the profile's time and answers with the token hash (module docstring)."""

    def __init__(self, config: LlamaConfig, time_model: StepTimeModel, *, speedup: float = 1.0, seed: int = 0,
                 output_vocab: int | None = None, never: frozenset[int] = frozenset(),
                 clock: Callable[[], float] = time.perf_counter, sleep: Callable[[float], None] = time.sleep
                 ) -> None:
        """`config` is the served model's (modeled_config makes the KV shape); output tokens are drawn
        from ids [0, output_vocab) (the tokenizer's vocabulary, when smaller than the config's: a random
        model's byte tokenizer decodes 258 ids), never the end of sequence nor an id in `never`;
        `clock` and `sleep` time the wait (tests inject both)."""
        super().__init__()
        if not speedup > 0:
            raise ValueError(f"speedup must be > 0, got {speedup}")
        self.config = modeled_config(config)
        self.time_model = time_model
        self.speedup = speedup
        self._start = mix(seed + 1)
        self._outputs = min(output_vocab or config.vocab_size, config.vocab_size)
        self._never = never | {config.eos_token_id}
        if self._outputs <= len(self._never):
            raise ValueError(f"no output token left: {self._outputs} ids, {len(self._never)} excluded")
        self._clock = clock
        self._sleep = sleep
        self.anchor = nn.Parameter(torch.zeros(1), requires_grad=False)
        """The one parameter: float32 (the KV dtype the engine reads from it), 4 bytes of weights."""
        self._buffer = torch.zeros(0, self.config.vocab_size)
        self._peaks = torch.zeros(0, dtype=torch.int64)
        self.modeled_s = 0.0
        """Modeled seconds of every step so far (before the speed-up)."""

    def _logits(self, rows: int) -> torch.Tensor:
        """A zeroed [rows, vocab] buffer, reused across steps: the engine reads one step's logits before
        it asks for the next (and clones those it keeps), and zeroing last step's peaks is cheaper than
        a fresh vocab-wide tensor per row."""
        if self._buffer.shape[0] < rows:
            self._buffer = torch.zeros(max(rows, 2 * self._buffer.shape[0]), self.config.vocab_size)
        else:
            self._buffer[torch.arange(len(self._peaks)), self._peaks] = 0.0
        return self._buffer[:rows]

    def next_token(self, state: int) -> int:
        """The token that follows a sequence whose last state is `state` (never end of sequence: a
        modeled reply runs to max_tokens, so its length is the request's too)."""
        token = mix(state ^ 0xD1B54A32D192ED03) % self._outputs
        while token in self._never:
            token = (token + 1) % self._outputs
        return token

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, batch: AttentionBatch,
                kv_cache: torch.Tensor, logits_indices: torch.Tensor) -> torch.Tensor:
        # One logits row per sequence, at its last new token: what `logits_indices` selects in the real model.
        t0 = self._clock()
        ids: list[int] = input_ids.tolist()
        cu: list[int] = batch.cu_seqlens.tolist()
        prefix: list[int] = batch.prefix_lens.tolist()
        bs = kv_cache.shape[3]
        # kv_cache [num_blocks, 1, 2, block_size, 1, 4]: K of the only layer and head holds the state.
        states = kv_cache[:, 0, 0, :, 0]
        written: list[int] = []
        last: list[int] = []
        for i in range(len(cu) - 1):
            start = self._start
            if prefix[i]:
                p = prefix[i] - 1
                block = int(batch.block_tables[i, p // bs])
                start = sum(int(limb) << (16 * k) for k, limb in enumerate(states[block, p % bs].tolist()))
            seq = chain(start, ids[cu[i]: cu[i + 1]])
            written += seq
            last.append(seq[-1])
        limbs = torch.tensor([[(s >> (16 * k)) & _LIMB for k in range(HASH_LIMBS)] for s in written],
                             dtype=kv_cache.dtype)
        slots = batch.slot_mapping.cpu()
        states[slots // bs, slots % bs] = limbs.to(kv_cache.device)
        logits = self._logits(len(last))
        self._peaks = torch.tensor([self.next_token(s) for s in last])
        logits[torch.arange(len(last)), self._peaks] = PEAK_LOGIT
        d = batch.num_decodes
        step = self.time_model.step_s([PrefillChunk(cu[i + 1] - cu[i], prefix[i]) for i in range(d, len(cu) - 1)],
                                      [prefix[i] + 1 for i in range(d)])
        self.modeled_s += step
        wait = t0 + step / self.speedup - self._clock()
        if wait > 0:
            self._sleep(wait)
        return logits
