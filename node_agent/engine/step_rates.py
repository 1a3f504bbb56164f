"""What an engine's steps measure of its speed: the step floor and the prefill rate beyond it, the two
figures an agent heartbeats (NodeLoad.step_floor_s, prefill_tokens_per_s) and the router prices
queues and prefills with. One implementation for the agent's runner and the engine simulator
(cluster.sim.engine_sim), so the simulated router reads what a live one would."""

from dataclasses import dataclass

RATE_SMOOTHING = 0.2
"""Weight of the newest step in the prefill-rate and step-floor averages."""
RATE_MIN_CHUNK = 16
"""Prefill chunks shorter than this (tokens, a block) do not measure the rate: their time beyond the floor is
mostly noise, and with no floor yet it is all floor. A restarted agent whose prompts were cached on
its disk ran 2-token chunks only, read ~100-250 tokens/s where it computes 2,000, and the router's
load cap, which exempts half a second of a node's prefill, then sent requests away from their
prefix."""


@dataclass(slots=True)
class StepRates:
    prefill_tokens_per_s: float = 0.0
    """Measured (EWMA), over the steps that ran a prefill chunk of RATE_MIN_CHUNK tokens or more: their
    tokens per second of step time beyond `step_floor_s` (the whole step's time while no floor is
    measured), the decodes that shared their forward included."""
    step_floor_s: float = 0.0
    """Measured (EWMA): seconds of a step that decodes only (0: none seen yet). What every step
    costs before its prefill tokens (launch, sampling, streaming the weights once, the running
    decodes' attention): on an H100 serving Llama-3-8B ~7 ms, the time of ~220 prefill tokens,
    so a price per token alone made a request with a short uncached tail look almost free."""

    def measure(self, tokens: int, running: int, seconds: float) -> None:
        """Fold one step of `tokens` computed, with `running` sequences running before it, into the
        floor (a decode-only step) or the prefill rate. A step of more tokens than one per running
        sequence ran a prefill chunk in the same forward as the decodes: its time beyond the floor
        (which holds the decodes) is the chunk's; with no floor yet, the whole step is, the decodes'
        tokens counting with it."""
        if seconds <= 0:
            return
        if 0 < tokens <= running:
            old = self.step_floor_s
            self.step_floor_s = seconds if old == 0.0 else old + RATE_SMOOTHING * (seconds - old)
        elif tokens > running:
            # A step no longer than the floor (noise, or a floor measured at a larger batch) says
            # nothing about the marginal rate.
            beyond = seconds - self.step_floor_s
            if beyond <= 0:
                return
            if tokens - running < RATE_MIN_CHUNK:
                return
            rate = (tokens - running if self.step_floor_s else tokens) / beyond
            old = self.prefill_tokens_per_s
            self.prefill_tokens_per_s = rate if old == 0.0 else old + RATE_SMOOTHING * (rate - old)
