"""Engine metrics: live counters the engine updates, and the frozen snapshot rendered with the memory
tiers' (common.metrics.exposition.render_prometheus)."""

# metric() returns a dataclasses.field (metadata only), which RUF009 takes for a mutable default.
# ruff: noqa: RUF009

from dataclasses import dataclass, field

from radixmesh.common.metrics.exposition import Histogram, HistogramSnapshot, metric
from radixmesh.proto.serve.tokens import HIT_SOURCES

TTFT_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
"""Upper bounds (seconds) of the time-to-first-token histogram."""


@dataclass(slots=True)
class EngineCounters:
    """Monotonic counters and the TTFT histogram, updated as the engine works (mutable)."""

    steps: int = 0
    prompt_tokens: int = 0
    computed_tokens: int = 0
    generated_tokens: int = 0
    cached_tokens: dict[str, int] = field(default_factory=lambda: dict.fromkeys(HIT_SOURCES, 0))
    finished: dict[str, int] = field(default_factory=dict)
    preemptions: dict[str, int] = field(default_factory=dict)
    swapped_out_bytes: int = 0
    swapped_in_bytes: int = 0
    promoted_blocks: int = 0
    demoted_blocks: int = 0
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS_S))

    def observe_ttft(self, seconds: float) -> None:
        self.ttft.observe(seconds)

    def count(self, table: dict[str, int], key: str, n: int = 1) -> None:
        table[key] = table.get(key, 0) + n


@dataclass(frozen=True, slots=True)
class EngineStats:
    """Every engine metric at one instant; renders as ``radixmesh_engine_*`` and
    ``radixmesh_time_to_first_token_seconds``."""

    engine_steps: int = metric("counter", "Scheduling steps run.")
    engine_prompt_tokens: int = metric("counter", "Prompt tokens of finished requests.")
    engine_cached_tokens: dict[str, int] = metric(
        "counter", "Prompt tokens served from cached KV instead of computed, by source.", "source")
    engine_computed_tokens: int = metric("counter", "Tokens run through the model (prefill and decode).")
    engine_generated_tokens: int = metric("counter", "Tokens sampled.")
    engine_requests_finished: dict[str, int] = metric("counter", "Requests finished, by reason.", "reason")
    engine_preemptions: dict[str, int] = metric("counter", "Sequences preempted, by mode.", "mode")
    engine_swap_out_bytes: int = metric("counter", "KV bytes copied to the host tier by preemption.")
    engine_swap_in_bytes: int = metric("counter", "KV bytes copied back from the host tier.")
    engine_promoted_blocks: int = metric("counter", "Host-tier prefix blocks promoted to the gpu tier.")
    engine_demoted_blocks: int = metric("counter", "Gpu prefix blocks copied to the host tier on eviction.")
    engine_running_requests: int = metric("gauge", "Requests holding gpu blocks now.")
    engine_waiting_requests: int = metric("gauge", "Requests queued (new or preempted).")
    time_to_first_token_seconds: HistogramSnapshot = metric(
        "histogram", "Time from arrival to first sampled token.")


def engine_stats(c: EngineCounters, running: int, waiting: int) -> EngineStats:
    """A snapshot of `c` plus the current queue lengths."""
    return EngineStats(
        engine_steps=c.steps,
        engine_prompt_tokens=c.prompt_tokens,
        engine_cached_tokens=dict(c.cached_tokens),
        engine_computed_tokens=c.computed_tokens,
        engine_generated_tokens=c.generated_tokens,
        engine_requests_finished=dict(c.finished),
        engine_preemptions=dict(c.preemptions),
        engine_swap_out_bytes=c.swapped_out_bytes,
        engine_swap_in_bytes=c.swapped_in_bytes,
        engine_promoted_blocks=c.promoted_blocks,
        engine_demoted_blocks=c.demoted_blocks,
        engine_running_requests=running,
        engine_waiting_requests=waiting,
        time_to_first_token_seconds=c.ttft.snapshot(),
    )
