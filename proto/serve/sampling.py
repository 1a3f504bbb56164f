"""How a request samples, the log-probabilities it reports of what it sampled, and why it stopped: part
of every serve plan and result."""

import math
import random
from dataclasses import dataclass
from enum import StrEnum

MAX_SEED = 2**63 - 1
"""Largest seed a request may carry (OpenAI's `seed` is a signed 64-bit integer)."""
MAX_STOP_STRINGS = 4
"""OpenAI's limit on `stop` strings per request."""
MAX_STOP_CHARS = 1024
"""Longest stop string: the engine holds back that much text per request while it decodes."""
MAX_TOP_LOGPROBS = 20
"""Most alternatives per token a request may ask for (OpenAI's limit for top_logprobs)."""


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
    logprobs: int | None = None
    """Return each generated token's log-probability with this many most likely alternatives
    (0..MAX_TOP_LOGPROBS); None: no log-probabilities."""
    stop: tuple[str, ...] = ()
    """Stop once the decoded output contains any of these (the engine decodes as it samples, so it
    stops on the token that completes one: no wasted decode steps, and exact usage). The token is
    kept in the output ids; the reply's text ends right before the stop string (stop_strings)."""

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not (self.temperature >= 0.0 and math.isfinite(self.temperature)):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.seed is not None and not 0 <= self.seed <= MAX_SEED:
            raise ValueError(f"seed must be in [0, {MAX_SEED}], got {self.seed}")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {self.logprobs}")
        if len(self.stop) > MAX_STOP_STRINGS or not all(0 < len(s) <= MAX_STOP_CHARS for s in self.stop):
            raise ValueError(f"stop takes at most {MAX_STOP_STRINGS} non-empty strings of at most "
                             f"{MAX_STOP_CHARS} characters")


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One generated token's log-probability and the most likely tokens at its position (OpenAI's
    `logprobs` / `top_logprobs`), as the engine computes them and every hop (agent, router, HTTP)
    carries them.

    Log-probabilities are log-softmax of the model's raw logits at that position, the logits the
    token was sampled from (before temperature and top-p, as vLLM's default "raw_logprobs").
    """

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()
    """(token id, log-probability), most likely first; as many as the request asked for."""


class FinishReason(StrEnum):
    LENGTH = "length"
    STOP = "stop"
    PREFILLED = "prefilled"
    """A prefill-only request (the prefill phase of a split request): its prompt's KV is computed and
    cached, and no token was sampled."""
