"""How a request samples and why it stopped: part of every serve plan and result."""

import math
import random
from dataclasses import dataclass
from enum import StrEnum

MAX_SEED = 2**63 - 1
"""Largest seed a request may carry (OpenAI's `seed` is a signed 64-bit integer)."""


def draw_seed(rng: random.Random) -> int:
    """A seed for a request that brought none (the router fixes one so retries reproduce it)."""
    return rng.getrandbits(62)


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to pick each next token, and when to stop."""

    max_tokens: int = 16
    """Tokens to generate at most (>= 1)."""
    temperature: float = 0.0
    """0 is greedy (argmax); otherwise logits are divided by it before softmax."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose probability reaches top_p, in (0, 1]."""
    seed: int | None = None
    """Seeds this request's sampling; token i uses (seed, i), so preemption never changes the draw.
    None: the engine draws one from its injected random source at submit."""
    stop_token_ids: tuple[int, ...] = ()
    """Stop after generating any of these (the stop token is kept in the output)."""
    ignore_eos: bool = False
    """Keep generating past the model's EOS token (benchmarks want fixed lengths)."""

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not (self.temperature >= 0.0 and math.isfinite(self.temperature)):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.seed is not None and not 0 <= self.seed <= MAX_SEED:
            raise ValueError(f"seed must be in [0, {MAX_SEED}], got {self.seed}")


class FinishReason(StrEnum):
    LENGTH = "length"
    STOP = "stop"
