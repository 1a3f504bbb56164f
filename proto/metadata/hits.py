"""Hit counts: what one finished request reused (reported by its node) and the cumulative counters
the metadata service keeps per scope (what `/stats` and the CLI show)."""

from dataclasses import asdict, dataclass, fields

from radixmesh.proto.metadata.limits import MAX_REQUEST_ID_CHARS, MAX_TENANT_CHARS, check_text
from radixmesh.proto.serve.tokens import TokenSources

MAX_PROMPT_TOKENS = 1 << 31
"""Tokens one request may report (no context is longer; keeps the counters' sums meaningful)."""


@dataclass(frozen=True, slots=True)
class RequestHits:
    """What one finished request reused, as its node reports it in a heartbeat."""

    request_id: str
    tenant: str
    tokens: TokenSources

    def __post_init__(self) -> None:
        check_text("request id", self.request_id, MAX_REQUEST_ID_CHARS)
        check_text("tenant", self.tenant, MAX_TENANT_CHARS)
        if self.tokens.prompt > MAX_PROMPT_TOKENS:
            raise ValueError(f"a request reports at most {MAX_PROMPT_TOKENS} tokens, got {self.tokens.prompt}")


@dataclass(frozen=True, slots=True)
class HitCounters:
    """Cumulative token counts of one scope."""

    requests: int = 0
    prompt_tokens: int = 0
    local_gpu_tokens: int = 0
    local_host_tokens: int = 0
    local_disk_tokens: int = 0
    remote_tokens: int = 0
    miss_tokens: int = 0
    cluster_cached_tokens: int = 0
    regret_tokens: int = 0
    predicted_local_tokens: int = 0
    realized_local_tokens: int = 0

    @property
    def hit_rate(self) -> float:
        """Token-weighted: (gpu + host + disk + remote) / prompt; 0 before any request."""
        hits = self.local_gpu_tokens + self.local_host_tokens + self.local_disk_tokens + self.remote_tokens
        return hits / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def index_precision(self) -> float:
        """realized / predicted local prefix tokens; 0 before any prediction."""
        return self.realized_local_tokens / self.predicted_local_tokens if self.predicted_local_tokens else 0.0

    def plus(self, delta: dict[str, int]) -> "HitCounters":
        merged = asdict(self)
        for name, value in delta.items():
            merged[name] += value
        return HitCounters(**merged)


COUNTER_FIELDS = tuple(f.name for f in fields(HitCounters))


@dataclass(frozen=True, slots=True)
class HitStats:
    total: HitCounters
    per_node: dict[str, HitCounters]
    per_tenant: dict[str, HitCounters]
