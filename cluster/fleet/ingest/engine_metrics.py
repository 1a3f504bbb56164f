"""An external engine's load, read from its Prometheus `/metrics` the way vLLM names it.

vLLM v1 (`vllm/v1/metrics/loggers.py`) exports, per engine core (label `engine`):
`vllm:num_requests_waiting`, `vllm:num_requests_running`, `vllm:kv_cache_usage_perc` (a fraction
in [0, 1]; `vllm:gpu_cache_usage_perc` before v0.10) and `vllm:cache_config_info` whose labels carry
`num_gpu_blocks`. SGLang's `sglang:num_queue_reqs` / `sglang:num_running_reqs` are read too.
Counts add up over engine cores; usage is their mean.
"""

import math
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

_WAITING = ("vllm:num_requests_waiting", "sglang:num_queue_reqs")
_RUNNING = ("vllm:num_requests_running", "sglang:num_running_reqs")
_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
_CACHE_INFO = "vllm:cache_config_info"


@dataclass(frozen=True, slots=True)
class EngineMetrics:
    waiting: int = 0
    running: int = 0
    kv_usage: float = 0.0
    """Fraction of the KV cache in use, [0, 1]."""
    num_gpu_blocks: int | None = None
    """The engine's KV cache size in its own blocks, when it says."""


def parse_engine_metrics(text: str) -> EngineMetrics:
    """Load figures from an exposition; ValueError when `text` is not Prometheus text format."""
    sums: dict[str, float] = {}
    usage: list[float] = []
    blocks: int | None = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not math.isfinite(sample.value):
                continue
            if sample.name in _WAITING or sample.name in _RUNNING:
                key = "waiting" if sample.name in _WAITING else "running"
                sums[key] = sums.get(key, 0.0) + sample.value
            elif sample.name in _USAGE:
                usage.append(min(max(sample.value, 0.0), 1.0))
            elif sample.name == _CACHE_INFO and sample.labels.get("num_gpu_blocks", "").isdigit():
                blocks = (blocks or 0) + int(sample.labels["num_gpu_blocks"])
    return EngineMetrics(
        waiting=max(0, round(sums.get("waiting", 0.0))),
        running=max(0, round(sums.get("running", 0.0))),
        kv_usage=sum(usage) / len(usage) if usage else 0.0,
        num_gpu_blocks=blocks,
    )
