"""What the router's /stats and /metrics answer: the /stats document (the router's own counters beside
the metadata service's GetStats) and one exposition merging the router's scrape with its agents'."""

import logging
from collections.abc import Callable, Mapping
from dataclasses import asdict

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from radixmesh.cluster.router.metrics import RouterMetrics, TokenTable
from radixmesh.common.metrics.exposition import write_exposition
from radixmesh.proto.ids import NodeId
from radixmesh.proto.metadata.hits import HitCounters
from radixmesh.proto.metadata.messages import ClusterStats

logger = logging.getLogger(__name__)


def _counters_dict(c: HitCounters) -> dict[str, object]:
    d: dict[str, object] = asdict(c)
    d["hit_rate"] = c.hit_rate
    d["index_precision"] = c.index_precision
    return d


def stats_document(metrics: RouterMetrics, cluster: ClusterStats | None, *, policy: str, active_policy: str,
                   metadata_available: bool, inflight: Mapping[NodeId, int],
                   tenant_label: Callable[[str], str] | None = None) -> dict[str, object]:
    """The /stats JSON. "router" holds what this router saw in the ServeResults it received;
    "metadata" holds the metadata service's GetStats (hits the agents reported in heartbeats, joined
    with Match predictions), or null when the service does not answer. Its "tenants" table is there
    only with `tenant_label` (the admin's view), each tenant under tenant_label(salt): a salt is
    never shown."""
    nodes = sorted(set(inflight) | set(metrics.per_node) | set(metrics.routed))
    per_node = {
        n: {"inflight": inflight.get(n, 0), "routed": metrics.routed.get(n, 0),
            "failed_attempts": metrics.failed_attempts.get(n, 0),
            **metrics.per_node.get(n, TokenTable()).as_dict()}
        for n in nodes
    }
    router = {
        "source": "this router's own counters over the ServeResults it received",
        "policy": policy,
        "active_policy": active_policy,
        "metadata_available": metadata_available,
        "degraded": not metadata_available,
        "requests_by_status": dict(metrics.status_counts),
        "retries": metrics.retries,
        "role_decisions": dict(metrics.role_decisions),
        "handoffs": dict(metrics.handoffs),
        "handoff_bytes": metrics.handoff_bytes,
        "handoff_seconds": round(metrics.handoff_seconds.sum, 6),
        "handoff_overlap_seconds": round(metrics.handoff_overlap.sum, 6),
        **metrics.total.as_dict(),
        "nodes": per_node,
    }
    meta: dict[str, object] | None = None
    if cluster is not None:
        meta = {
            "source": "metadata service GetStats: hits reported by agents, joined with Match predictions",
            "live_nodes": cluster.live_nodes,
            "indexed_blocks": cluster.indexed_blocks,
            "state_store": cluster.state_store,
            **_counters_dict(cluster.hits.total),
            "nodes": {n: _counters_dict(c) for n, c in sorted(cluster.hits.per_node.items())},
        }
        if tenant_label is not None:
            meta["tenants"] = {tenant_label(t): _counters_dict(c) for t, c in sorted(cluster.hits.per_tenant.items())}
    return {"router": router, "metadata": meta}


def merge_expositions(own: str, agents: Mapping[NodeId, str]) -> str:
    """One valid exposition of the router's text and each agent's, agent samples labelled `node`.

    A family present in several sources is written once (one HELP/TYPE, the first source's); an agent
    family whose type disagrees with the first one seen is dropped with a warning, and so is a sample
    whose name and labels were already written (the first wins), rather than producing an invalid
    scrape. Raises ValueError when a text does not parse.
    """
    families: dict[str, Metric] = {}
    seen: set[tuple[str, frozenset[tuple[str, str]]]] = set()
    sources: list[tuple[str, NodeId | None]] = [(own, None), *((t, n) for n, t in sorted(agents.items()))]
    for text, node in sources:
        for fam in text_string_to_metric_families(text):
            merged = families.get(fam.name)
            if merged is None:
                merged = families[fam.name] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
            elif merged.type != fam.type:
                logger.warning("metric %s is a %s on node %s but a %s elsewhere: dropped", fam.name,
                               fam.type, node, merged.type)
                continue
            for s in fam.samples:
                labels = dict(s.labels) if node is None else {**s.labels, "node": node}
                key = (s.name, frozenset(labels.items()))
                if key in seen:
                    logger.warning("sample %s%s of node %s repeats one already merged: dropped", s.name, labels,
                                   node)
                    continue
                seen.add(key)
                merged.samples.append(Sample(s.name, labels, s.value, s.timestamp, s.exemplar))
    return write_exposition(families.values())
