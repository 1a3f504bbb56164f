"""Log-probabilities of generated tokens (OpenAI's `logprobs` / `top_logprobs`), as the engine
computes them and every hop (agent, router, HTTP) carries them."""

from dataclasses import dataclass

MAX_TOP_LOGPROBS = 20
"""Most alternatives per token a request may ask for (OpenAI's limit for top_logprobs)."""


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One generated token's log-probability and the most likely tokens at its position.

    Log-probabilities are log-softmax of the model's raw logits at that position, the logits the
    token was sampled from (before temperature and top-p, as vLLM's default "raw_logprobs").
    """

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()
    """(token id, log-probability), most likely first; as many as the request asked for."""
