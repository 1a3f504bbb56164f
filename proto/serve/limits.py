"""What a request must satisfy before anything is routed, pulled or queued, and the typed refusal.

The router checks a request against its agents' limits before routing, the agent again before it
pulls, the engine again before it queues: one rule, three callers, so the three can never disagree.
"""

from collections.abc import Sequence
from dataclasses import dataclass


class InvalidRequest(ValueError):
    """A request refused as invalid: nothing was routed, pulled, taken or queued. It crosses the
    agent/router boundary as itself, so the client's 4xx names the agent's reason."""


class AgentBusy(Exception):
    """An agent refused a plan for capacity (it holds AgentConfig.max_requests already): nothing was
    pulled, taken or queued. The router tries another node, and answers 429 when every one is busy."""


@dataclass(frozen=True, slots=True)
class PromptLimits:
    """The model's limits on a prompt."""

    vocab_size: int
    """Token ids lie in [0, vocab_size)."""
    max_context_tokens: int
    """prompt + max_tokens must fit (the model's context length)."""

    def __post_init__(self) -> None:
        if self.vocab_size < 1 or self.max_context_tokens < 1:
            raise ValueError(f"vocab_size and max_context_tokens must be >= 1: {self}")

    def check(self, prompt: Sequence[int], max_tokens: int) -> None:
        """InvalidRequest for an empty prompt, a token id outside the vocabulary, or a prompt plus
        max_tokens past the context length."""
        if not prompt:
            raise InvalidRequest("the prompt is empty")
        # The length first: one comparison refuses a million ids before any is looked at (issue 38).
        if len(prompt) + max_tokens > self.max_context_tokens:
            raise InvalidRequest(f"prompt ({len(prompt)} tokens) + max_tokens ({max_tokens}) exceeds the "
                                 f"context limit of {self.max_context_tokens} tokens")
        bad = next((t for t in prompt if not (isinstance(t, int) and 0 <= t < self.vocab_size)), None)
        if bad is not None:
            raise InvalidRequest(f"token id {bad!r} is outside the vocabulary [0, {self.vocab_size})")


def usable_prefix_blocks(num_tokens: int, block_size: int) -> int:
    """Leading full blocks of a `num_tokens` sequence that may come from a cache or a peer:

        tokens  [0, bs) [bs, 2bs) ... | the block holding the last token
                reusable                | never reused: the engine computes the last token, whose
                                        | logits give the next sampled token
    """
    return max(0, num_tokens - 1) // block_size
