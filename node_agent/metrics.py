"""The node agent's own counters (served requests, prompt tokens by source, pulls by peer) and their
snapshot, rendered by common.metrics.exposition; the engine and memory metrics come from the engine itself
(the agent's time-to-first-token is the engine's histogram, radixmesh_time_to_first_token_seconds: the
agent queues a request in its engine on arrival, so that histogram counts its pull wait too)."""

# metric() returns a dataclasses.field (metadata only), which RUF009 takes for a mutable default.
# ruff: noqa: RUF009

from collections.abc import Mapping
from dataclasses import dataclass, field

from radixmesh.common.metrics.exposition import metric, render_prometheus
from radixmesh.node_agent.transfer.stats import PeerStats
from radixmesh.proto.ids import NodeId
from radixmesh.proto.serve.plan import ServeStats
from radixmesh.proto.serve.tokens import SOURCES


@dataclass(slots=True)
class AgentCounters:
    """Monotonic counters of one agent (mutated on the event loop only)."""

    requests: int = 0
    prompt_tokens: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SOURCES, 0))
    pull_failures: int = 0
    background_errors: int = 0
    """Unexpected failures of background loops (the publisher's), each followed by a retry."""

    def count_request(self, stats: ServeStats) -> None:
        self.requests += 1
        for source, n in stats.tokens.items():
            self.prompt_tokens[source] += n
        self.pull_failures += stats.pull_failed


@dataclass(frozen=True, slots=True)
class AgentStats:
    """The agent's counters and per-peer pull totals at one instant; every sample labelled `node`."""

    node: str
    agent_requests: int = metric("counter", "Requests served.")
    agent_prompt_tokens: dict[str, int] = metric(
        "counter", "Prompt tokens by where their KV came from.", "source")
    agent_pull_failures: int = metric("counter", "Requests whose planned pull fell short (recomputed).")
    agent_background_errors: int = metric(
        "counter", "Unexpected failures of background loops (publisher, heartbeats); each is retried with backoff.")
    pull_bytes: dict[str, int] = metric("counter", "KV bytes pulled from each peer.", "peer")
    pull_seconds: dict[str, float] = metric("counter", "Time spent pulling from each peer.", "peer")
    pulls: dict[tuple[str, str], int] = metric("counter", "Pulls by outcome.", "peer", "outcome")
    transfer_memory_path: dict[str, int] = metric(
        "gauge", "1 for the memory path pulled KV blocks take: host, cuda-direct or cuda-staged.", "path")
    agent_eviction_order: dict[str, int] = metric(
        "gauge", "1 for the order this agent evicts cached blocks in (lru, s3fifo, adaptive).", "order")
    agent_handoff: int = metric(
        "gauge", "1 when blocks a peer pulled from this agent are the first it evicts (hand-off), else 0.")
    agent_engine: dict[str, int] = metric(
        "gauge", "1 for the engine this agent runs: real, or modeled:<profile> (a GPU model's figures, not measured).",
        "engine")


def agent_stats(node: NodeId, counters: AgentCounters, peers: Mapping[NodeId, PeerStats],
                memory_path: str | None, *, eviction: str, handoff: bool, engine: str = "real") -> AgentStats:
    """A snapshot of `counters`, of the pull totals of each peer in `peers`, of the transfer
    plane's memory path (None: no plane) and of the cache settings (`eviction` order, `handoff`)."""
    ordered = sorted(peers.items())
    return AgentStats(
        node=node,
        agent_requests=counters.requests,
        agent_prompt_tokens=dict(counters.prompt_tokens),
        agent_pull_failures=counters.pull_failures,
        agent_background_errors=counters.background_errors,
        pull_bytes={peer: s.bytes for peer, s in ordered},
        pull_seconds={peer: s.seconds for peer, s in ordered},
        pulls={(peer, outcome): n for peer, s in ordered for outcome, n in sorted(s.outcomes.items())},
        transfer_memory_path={} if memory_path is None else {memory_path: 1},
        agent_eviction_order={eviction: 1},
        agent_handoff=int(handoff),
        agent_engine={engine: 1},
    )


def render_agent_metrics(node: NodeId, counters: AgentCounters, peers: Mapping[NodeId, PeerStats],
                         memory_path: str | None, labels: Mapping[str, str] | None = None, *,
                         eviction: str, handoff: bool, engine: str = "real") -> str:
    """Prometheus text of agent_stats(...), every sample labelled with `labels` too."""
    return render_prometheus([agent_stats(node, counters, peers, memory_path, eviction=eviction, handoff=handoff,
                                          engine=engine)], labels)
