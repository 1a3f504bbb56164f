"""What one engine step costs on a profile's hardware: a roofline over the step's shape.

    step = step_overhead
         + max(weights_read, linear_base * [the step prefills] + linear_per_token * T)
                                                            T: every token of the step (one forward)
         + attention_per_pair * sum over prefill chunks of n * (c + (n + 1) / 2)
         + sum over decoding sequences of (decode_per_seq + kv_read_per_token * context)

A prefill chunk of n new tokens after c cached ones attends to c + i + 1 tokens for its i-th token
(causal), hence n * (c + (n + 1) / 2) pairs; so prefilling n after a cached c costs less than
prefilling all c + n (by c * linear + about c^2 / 2 pairs), and every term grows with tokens.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from radixmesh.node_agent.model.modeled.profile import Figures


class PrefillChunk(NamedTuple):
    """`new` prompt tokens computed after `cached` tokens already in the sequence's blocks."""

    new: int
    cached: int


@dataclass(frozen=True, slots=True)
class StepTimeModel:
    """Seconds of one step on the profile's hardware (before any speed-up)."""

    figures: Figures

    def step_s(self, prefills: Sequence[PrefillChunk], decode_contexts: Sequence[int]) -> float:
        """One forward over `prefills` and one-token decodes whose sequences hold `decode_contexts`
        tokens (the new one included); 0 for an empty step."""
        if not prefills and not decode_contexts:
            return 0.0
        f = self.figures
        tokens = sum(p.new for p in prefills) + len(decode_contexts)
        pairs = sum(p.new * (p.cached + (p.new + 1) / 2) for p in prefills)
        base = f.linear_base_s if prefills else 0.0
        return (f.step_overhead_s + max(f.weights_read_s, base + f.linear_s_per_token * tokens)
                + f.attention_s_per_token_pair * pairs
                + f.decode_s_per_seq * len(decode_contexts) + f.kv_read_s_per_token * sum(decode_contexts))

    def prefill_s(self, new: int, cached: int = 0) -> float:
        """One step that prefills `new` tokens after `cached` ones and decodes nothing."""
        return self.step_s([PrefillChunk(new, cached)], [])

    def wire_s(self, num_tokens: int) -> float:
        """Seconds the full KV of `num_tokens` takes on the profile's link."""
        return num_tokens * self.figures.kv_bytes_per_token / (self.figures.link_gbps * 1e9)
