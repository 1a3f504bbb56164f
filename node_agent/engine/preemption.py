"""Preemption policies: when a running sequence must give up its gpu blocks, swap them to the host
tier or drop them and recompute later, whichever the policy judges cheaper."""

from dataclasses import dataclass
from typing import Protocol

from radixmesh.node_agent.memory.sequence import PreemptMode


class PreemptionPolicy(Protocol):
    """Picks how to preempt a sequence of `num_blocks` written blocks holding `num_tokens` tokens,
    and may learn from the prefill and swap rates the engine observes."""

    def choose(self, num_blocks: int, num_tokens: int) -> PreemptMode: ...
    def observe_prefill(self, tokens: int, seconds: float) -> None: ...
    def observe_swap(self, nbytes: int, seconds: float) -> None: ...


@dataclass(slots=True)
class FixedPreemption:
    """Always the same mode (the "swap" and "recompute" registry entries)."""

    mode: PreemptMode

    def choose(self, num_blocks: int, num_tokens: int) -> PreemptMode:
        return self.mode

    def observe_prefill(self, tokens: int, seconds: float) -> None:
        """A fixed choice learns nothing."""

    def observe_swap(self, nbytes: int, seconds: float) -> None:
        """A fixed choice learns nothing."""


@dataclass(slots=True)
class CostPreemption:
    """Swap when moving the blocks out and back costs less time than prefilling the tokens again.

    Rates start at the given estimates and follow measurements (exponential average), so a node
    with slow host copies or a fast GPU learns to recompute.
    """

    block_bytes: int
    swap_bytes_per_s: float = 2e9
    prefill_tokens_per_s: float = 2e3
    smoothing: float = 0.2

    def choose(self, num_blocks: int, num_tokens: int) -> PreemptMode:
        swap_s = 2 * num_blocks * self.block_bytes / self.swap_bytes_per_s
        recompute_s = num_tokens / self.prefill_tokens_per_s
        return PreemptMode.SWAP if swap_s < recompute_s else PreemptMode.RECOMPUTE

    def observe_prefill(self, tokens: int, seconds: float) -> None:
        if tokens and seconds > 0:
            rate = tokens / seconds
            self.prefill_tokens_per_s += self.smoothing * (rate - self.prefill_tokens_per_s)

    def observe_swap(self, nbytes: int, seconds: float) -> None:
        if nbytes and seconds > 0:
            rate = nbytes / seconds
            self.swap_bytes_per_s += self.smoothing * (rate - self.swap_bytes_per_s)


def make_preemption_policy(name: str, block_bytes: int) -> PreemptionPolicy:
    """Registry of preemption policies: "cost" (default), "swap", "recompute"."""
    if name == "cost":
        return CostPreemption(block_bytes)
    if name in {m.value for m in PreemptMode}:
        return FixedPreemption(PreemptMode(name))
    raise ValueError(f"unknown preemption policy {name!r}; valid: ['cost', 'recompute', 'swap']")
