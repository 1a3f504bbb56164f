"""Engine metrics: live counters the engine updates, and the frozen snapshot rendered with the memory
tiers' (common.metrics.exposition.render_prometheus).

The snapshot speaks the Gateway API Inference Extension's model-server protocol too (what llm-d's and
AIBrix's endpoint pickers scrape, by vLLM's names): `vllm:num_requests_waiting` and
`vllm:num_requests_running` here, the gpu tier's `vllm:kv_cache_usage_perc` in MemoryStats. Its
latency histograms keep radixmesh's names: the protocol reads none of them."""

# metric() returns a dataclasses.field (metadata only), which RUF009 takes for a mutable default.
# ruff: noqa: RUF009

from dataclasses import dataclass, field

from radixmesh.common.metrics.exposition import Histogram, HistogramSnapshot, metric
from radixmesh.proto.serve.tokens import HIT_SOURCES

# Bounds after vLLM's (v1 loggers), so a dashboard reads an agent's quantiles as it reads vLLM's;
# inter-token and queue time gain millisecond bounds below vLLM's lowest, where a small model on one
# GPU decodes and an idle agent queues.
TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                  20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
"""Upper bounds (seconds) of radixmesh_time_to_first_token_seconds (vLLM's)."""
ITL_BUCKETS_S = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
                 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
"""Upper bounds (seconds) of radixmesh_inter_token_latency_seconds."""
QUEUE_TIME_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0,
                        10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
"""Upper bounds (seconds) of radixmesh_request_queue_time_seconds."""


@dataclass(slots=True)
class EngineCounters:
    """Monotonic counters and the latency histograms, updated as the engine works (mutable)."""

    steps: int = 0
    prompt_tokens: int = 0
    computed_tokens: int = 0
    generated_tokens: int = 0
    cached_tokens: dict[str, int] = field(default_factory=lambda: dict.fromkeys(HIT_SOURCES, 0))
    finished: dict[str, int] = field(default_factory=dict)
    preemptions: dict[str, int] = field(default_factory=dict)
    swapped_out_bytes: int = 0
    swapped_in_bytes: int = 0
    moved_in_seconds: float = 0.0
    """Seconds steps spent reading blocks into the gpu tier (promotions from host or disk, swap-ins):
    the part of a step's time that is not its forward (EngineRunner's rate measures the rest)."""
    promoted_blocks: int = 0
    demoted_blocks: int = 0
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS_S))
    inter_token: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS_S))
    queue_time: Histogram = field(default_factory=lambda: Histogram(QUEUE_TIME_BUCKETS_S))

    def observe_ttft(self, seconds: float) -> None:
        """A request's first token, `seconds` after it arrived."""
        self.ttft.observe(seconds)

    def observe_inter_token(self, seconds: float) -> None:
        """A request's second or later token, `seconds` after its previous one."""
        self.inter_token.observe(seconds)

    def observe_queue_time(self, seconds: float) -> None:
        """A request's first scheduling, `seconds` after it arrived (re-admissions after preemption
        are not counted: as vLLM's queue time, this is the wait before the request first ran)."""
        self.queue_time.observe(seconds)

    def count(self, table: dict[str, int], key: str, n: int = 1) -> None:
        table[key] = table.get(key, 0) + n


@dataclass(frozen=True, slots=True)
class EngineStats:
    """Every engine metric at one instant; renders as ``radixmesh_engine_*``, the latency histograms
    and the GAIE protocol's request gauges (``vllm:num_requests_*``)."""

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
    num_requests_running: int = metric(
        "gauge", "GAIE TotalRunningRequests: requests scheduled now (in the running batch, holding gpu "
        "blocks).", name="vllm:num_requests_running")
    num_requests_waiting: int = metric(
        "gauge", "GAIE TotalQueuedRequests: requests queued and not scheduled now (new, pulling their "
        "prefix, or preempted).", name="vllm:num_requests_waiting")
    time_to_first_token_seconds: HistogramSnapshot = metric(
        "histogram", "Time from arrival at this agent's engine to the first sampled token (pull waits "
        "included).")
    inter_token_latency_seconds: HistogramSnapshot = metric(
        "histogram", "Time between consecutive sampled tokens of one request.")
    request_queue_time_seconds: HistogramSnapshot = metric(
        "histogram", "Time from arrival to first scheduling: queued for a batch slot, KV blocks or a "
        "planned pull.")


def engine_stats(c: EngineCounters, running: int, waiting: int) -> EngineStats:
    """A snapshot of `c` plus the scheduler's queue lengths now: `running` sequences scheduled,
    `waiting` ones queued (not scheduled)."""
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
        num_requests_running=running,
        num_requests_waiting=waiting,
        time_to_first_token_seconds=c.ttft.snapshot(),
        inter_token_latency_seconds=c.inter_token.snapshot(),
        request_queue_time_seconds=c.queue_time.snapshot(),
    )
