"""The node agent's own counters (served requests, prompt tokens by source, pulls by peer) and their
Prometheus rendering; the engine and memory metrics come from the engine itself."""

from collections.abc import Mapping
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

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
    ttft_seconds: float = 0.0

    def count_request(self, stats: ServeStats) -> None:
        self.requests += 1
        for source, n in stats.tokens.items():
            self.prompt_tokens[source] += n
        self.pull_failures += stats.pull_failed
        self.ttft_seconds += stats.ttft_s


class _AgentCollector(Collector):
    def __init__(self, node: NodeId, counters: AgentCounters, peers: Mapping[NodeId, PeerStats]) -> None:
        self._node, self._c, self._peers = node, counters, peers

    def collect(self):  # type: ignore[no-untyped-def]  # prometheus_client's own signature
        node, c = self._node, self._c
        yield _counter("radixmesh_agent_requests", "Requests served", {"node": node}, c.requests)
        fam = CounterMetricFamily("radixmesh_agent_prompt_tokens", "Prompt tokens by where their KV came from",
                                  labels=["node", "source"])
        for source, n in c.prompt_tokens.items():
            fam.add_metric([node, source], n)
        yield fam
        yield _counter("radixmesh_agent_pull_failures", "Requests whose planned pull fell short (recomputed)",
                       {"node": node}, c.pull_failures)
        yield _counter("radixmesh_agent_ttft_seconds", "Sum of times to first token, pulls included",
                       {"node": node}, c.ttft_seconds)
        nbytes = CounterMetricFamily("radixmesh_pull_bytes", "KV bytes pulled from each peer",
                                     labels=["node", "peer"])
        secs = CounterMetricFamily("radixmesh_pull_seconds", "Time spent pulling from each peer",
                                   labels=["node", "peer"])
        pulls = CounterMetricFamily("radixmesh_pulls", "Pulls by outcome",
                                    labels=["node", "peer", "outcome"])
        for peer, s in sorted(self._peers.items()):
            nbytes.add_metric([node, peer], s.bytes)
            secs.add_metric([node, peer], s.seconds)
            for outcome, n in sorted(s.outcomes.items()):
                pulls.add_metric([node, peer, outcome], n)
        yield from (nbytes, secs, pulls)


def _counter(name: str, doc: str, labels: dict[str, str], value: float) -> CounterMetricFamily:
    fam = CounterMetricFamily(name, doc, labels=list(labels))
    fam.add_metric(list(labels.values()), value)
    return fam


def render_agent_metrics(node: NodeId, counters: AgentCounters, peers: Mapping[NodeId, PeerStats]) -> str:
    """Prometheus text of the agent's counters and per-peer pull totals."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_AgentCollector(node, counters, peers))
    return generate_latest(registry).decode()
