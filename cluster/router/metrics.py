"""The router's own counters: the plain token tables behind /stats and their snapshot for /metrics
(rendered by common.metrics.exposition, names fixed: the Grafana dashboard queries them).
cluster.observability.endpoints turns them into the /stats document and the merged scrape.

Every figure here is what the router itself observed in ServeResults it received; the metadata
service's GetStats (hits reported by agents in heartbeats) is a separate source, kept apart in /stats.
"""

# metric() returns a dataclasses.field (metadata only), which RUF009 takes for a mutable default.
# ruff: noqa: RUF009

import logging
from collections.abc import Callable
from dataclasses import dataclass, fields

from radixmesh.cluster.router.admission import Admission
from radixmesh.cluster.router.calibration import Calibration
from radixmesh.common.metrics.exposition import (
    Histogram,
    HistogramSnapshot,
    metric,
    render_prometheus,
)
from radixmesh.proto.ids import NodeId
from radixmesh.proto.serve.plan import ServeStats
from radixmesh.proto.serve.tokens import TokenSources

logger = logging.getLogger(__name__)

@dataclass(slots=True)
class TokenTable:
    """Cumulative prompt tokens by source of one scope (all requests, or one node)."""

    requests: int = 0
    tokens: TokenSources = TokenSources()  # frozen, so one shared default is safe
    regret_tokens: int = 0
    """Tokens Match saw cached in the cluster that were recomputed anyway."""
    predicted_local_tokens: int = 0
    """Local prefix tokens the router expected on the serving node (index and pending holders)."""
    realized_local_tokens: int = 0
    """Of those, the tokens the node really served from its own tiers."""

    def add(self, stats: ServeStats, regret: int, predicted_local: int) -> None:
        local = stats.tokens.local
        self.requests += 1
        self.tokens += stats.tokens
        self.regret_tokens += regret
        self.predicted_local_tokens += predicted_local
        self.realized_local_tokens += min(local, predicted_local)

    @property
    def prompt_tokens(self) -> int:
        return self.tokens.prompt

    @property
    def hit_rate(self) -> float:
        """Token-weighted (local + remote) / prompt; 0 before any request."""
        return self.tokens.hits / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def index_precision(self) -> float:
        """realized / predicted local tokens; 1 before any prediction (nothing was wrong yet)."""
        return self.realized_local_tokens / self.predicted_local_tokens if self.predicted_local_tokens else 1.0

    def as_dict(self) -> dict[str, object]:
        """Flat: requests, prompt_tokens, tokens by source (local_gpu ... computed), the rest."""
        d: dict[str, object] = {"requests": self.requests, "prompt_tokens": self.prompt_tokens,
                                **dict(self.tokens.items())}
        d.update((f.name, getattr(self, f.name)) for f in fields(self) if f.name not in ("requests", "tokens"))
        d["hit_rate"] = self.hit_rate
        d["hit_rate_by_source"] = {
            s: (n / self.prompt_tokens if self.prompt_tokens else 0.0) for s, n in self.tokens.items()
        }
        d["index_precision"] = self.index_precision
        return d


TTFT_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
"""Upper bounds (seconds) of radixmesh_router_ttft_seconds."""
ITL_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
"""Upper bounds (seconds) of radixmesh_router_inter_token_latency_seconds."""
TRANSFER_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
"""Upper bounds (seconds) of radixmesh_transfer_seconds."""


@dataclass(frozen=True, slots=True)
class RouterStats:
    """Every router metric at one instant (names fixed: the Grafana dashboard queries them)."""

    router_requests: dict[str, int] = metric("counter", "Requests answered by the router, by outcome.", "status")
    routing_decisions: dict[tuple[str, str], int] = metric(
        "counter", "Routing decisions by policy and node.", "policy", "node")
    # No hit-rate gauge: a lifetime ratio hides the last minutes; the hit rate is the rate() of these
    # counters, hits (source != "computed") over all (deploy/grafana-dashboard.json, deploy/alerts.yml).
    prompt_tokens: dict[str, int] = metric("counter", "Prompt tokens served, by source.", "source")
    remote_hit_blocks: int = metric("counter", "Prompt blocks pulled from peers and used.")
    transfer_bytes: int = metric("counter", "KV bytes pulled between nodes.")
    transfer_seconds: HistogramSnapshot = metric("histogram", "Time of one request's pull.")
    router_ttft_seconds: HistogramSnapshot = metric("histogram", "Time to first token, end to end at the router.")
    router_inter_token_latency_seconds: HistogramSnapshot = metric(
        "histogram", "Time between consecutive tokens of a reply, as the router streams them.")
    router_e2e_request_latency_seconds: HistogramSnapshot = metric(
        "histogram", "Arrival at the router to the reply's last token, of requests served.")
    router_queue_seconds: HistogramSnapshot = metric(
        "histogram", "Time a request waited for a running slot of admission control.")
    routing_regret_tokens: int = metric(
        "counter", "Prompt tokens cached somewhere in the cluster (per Match) but recomputed.")
    metadata_available: int = metric(
        "gauge", "1 while the metadata service answers Match, 0 while routing degrades.")
    router_requests_running: int = metric("gauge", "Requests holding a running slot of admission control.")
    router_requests_waiting: int = metric("gauge", "Requests waiting for a running slot.")
    role_decisions: dict[str, int] = metric(
        "counter", "Routing decisions by the role of the chosen agent (both, prefill, decode).", "role")
    handoffs: dict[str, int] = metric(
        "counter", "Prefill-to-decode hand-offs, by outcome: pulled (every planned block the decode agent "
        "lacked), partial (some recomputed), recomputed (nothing pulled) or unplanned (no full block, or the "
        "prefill agent's address not known yet).", "outcome")
    role_inflight: dict[str, int] = metric(
        "gauge", "Requests in flight at the agents of each role (a split cluster's prefill and decode queues).", "role")
    handoff_bytes: int = metric("counter", "KV bytes decode agents pulled from prefill agents.")
    handoff_seconds: HistogramSnapshot = metric(
        "histogram", "Time of one hand-off: the decode agent's pull of the prompt's KV from its prefill agent.")
    handoff_overlap_seconds: HistogramSnapshot = metric(
        "histogram", "Of one hand-off's time, the part that ran while its prefill was still computing (a "
        "streamed hand-off; 0 when it began after the prefill).")


class RouterMetrics:
    """The router's live counters (one set per router, so several can live in one process): the /stats
    tables, and what `stats()` snapshots for /metrics."""

    def __init__(self, model_name: str) -> None:
        """`model_name` labels every sample (the served model, as vLLM labels its families)."""
        self.model_name = model_name
        self.total = TokenTable()
        self.per_node: dict[NodeId, TokenTable] = {}
        self.routed: dict[NodeId, int] = {}
        self.decisions: dict[tuple[str, NodeId], int] = {}
        """Requests routed, by (policy, node)."""
        self.failed_attempts: dict[NodeId, int] = {}
        self.status_counts: dict[str, int] = {}
        self.retries = 0
        self.remote_hit_blocks = 0
        self.transfer_bytes = 0
        self.transfer_seconds = Histogram(TRANSFER_BUCKETS_S)
        self.ttft = Histogram(TTFT_BUCKETS_S)
        self.inter_token = Histogram(ITL_BUCKETS_S)
        self.e2e = Histogram(TTFT_BUCKETS_S)
        self.queue = Histogram(TTFT_BUCKETS_S)
        self.metadata_available = True
        """Set by the router: False while the metadata service does not answer."""
        self.admission: Admission | None = None
        """Set by the router: its running and waiting requests."""
        self.role_inflight: Callable[[], dict[str, int]] = dict
        """Set by the router: its requests in flight by the role of their agent."""
        self.role_decisions: dict[str, int] = {}
        self.handoffs: dict[str, int] = {}
        self.handoff_bytes = 0
        self.handoff_seconds = Histogram(TRANSFER_BUCKETS_S)
        self.handoff_overlap = Histogram(TRANSFER_BUCKETS_S)
        self.calibration = Calibration()
        """Each decision's prediction beside its outcome (the router records them as requests end)."""

    def record_request(self, status: str) -> None:
        self.status_counts[status] = self.status_counts.get(status, 0) + 1

    def record_decision(self, policy: str, node: NodeId) -> None:
        self.decisions[policy, node] = self.decisions.get((policy, node), 0) + 1
        self.routed[node] = self.routed.get(node, 0) + 1

    def record_role(self, role: str) -> None:
        """A decision chose an agent of `role`."""
        self.role_decisions[role] = self.role_decisions.get(role, 0) + 1

    def record_tokens(self, node: NodeId, stats: ServeStats, block_size: int, cluster_tokens: int,
                      predicted_local_tokens: int) -> None:
        """Count a finished request's prompt tokens by source and its pull, not its TTFT (a split
        cluster's prefill phase: its one token is no client's first token)."""
        regret = max(0, min(cluster_tokens, stats.prompt_tokens) - stats.tokens.hits)
        self.total.add(stats, regret, predicted_local_tokens)
        self.per_node.setdefault(node, TokenTable()).add(stats, regret, predicted_local_tokens)
        self.remote_hit_blocks += stats.tokens.remote // block_size
        if stats.pull_bytes or stats.pull_seconds:
            self.transfer_bytes += stats.pull_bytes
            self.transfer_seconds.observe(stats.pull_seconds)

    def record_handoff(self, stats: ServeStats, planned_blocks: int, ttft_s: float, overlap_s: float = 0.0) -> None:
        """A split cluster's decode phase ended: what its pull of `planned_blocks` moved, how much of
        it overlapped the prefill (`overlap_s`), and the client's TTFT (prefill, hand-off and the decode
        agent's first step)."""
        # Blocks the decode agent held already are skipped, not failed: pull_failed says what was recomputed.
        if not planned_blocks:
            outcome = "unplanned"
        elif stats.pull_failed:
            outcome = "partial" if stats.tokens.remote else "recomputed"
        else:
            outcome = "pulled"
        self.handoffs[outcome] = self.handoffs.get(outcome, 0) + 1
        self.handoff_bytes += stats.pull_bytes
        if stats.pull_bytes or stats.pull_seconds:
            self.handoff_seconds.observe(stats.pull_seconds)
            self.handoff_overlap.observe(overlap_s)
        self.ttft.observe(ttft_s)

    def record_failed_attempt(self, node: NodeId) -> None:
        """`node` became unavailable while serving a request that is retried elsewhere."""
        self.failed_attempts[node] = self.failed_attempts.get(node, 0) + 1
        self.retries += 1

    def record_served(self, node: NodeId, stats: ServeStats, block_size: int,
                      cluster_tokens: int, predicted_local_tokens: int, ttft_s: float) -> None:
        """Count one finished request; `cluster_tokens` is Match's cluster-wide prefix (0 without it)."""
        self.record_tokens(node, stats, block_size, cluster_tokens, predicted_local_tokens)
        self.ttft.observe(ttft_s)

    def stats(self) -> RouterStats:
        return RouterStats(
            router_requests=dict(self.status_counts),
            routing_decisions={(policy, str(node)): n for (policy, node), n in self.decisions.items()},
            prompt_tokens=dict(self.total.tokens.items()),
            remote_hit_blocks=self.remote_hit_blocks,
            transfer_bytes=self.transfer_bytes,
            transfer_seconds=self.transfer_seconds.snapshot(),
            router_ttft_seconds=self.ttft.snapshot(),
            router_inter_token_latency_seconds=self.inter_token.snapshot(),
            router_e2e_request_latency_seconds=self.e2e.snapshot(),
            router_queue_seconds=self.queue.snapshot(),
            routing_regret_tokens=self.total.regret_tokens,
            metadata_available=int(self.metadata_available),
            router_requests_running=self.admission.running if self.admission else 0,
            router_requests_waiting=self.admission.waiting if self.admission else 0,
            role_decisions=dict(self.role_decisions),
            role_inflight=self.role_inflight(),
            handoffs=dict(self.handoffs),
            handoff_bytes=self.handoff_bytes,
            handoff_seconds=self.handoff_seconds.snapshot(),
            handoff_overlap_seconds=self.handoff_overlap.snapshot(),
        )

    def render(self, *more: object) -> str:
        """Prometheus text of `stats()` and of `more` stats dataclasses of the router's parts."""
        return render_prometheus([self.stats(), *more], {"model_name": self.model_name})
