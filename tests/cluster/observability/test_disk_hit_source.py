"""`local_disk` as a hit source wherever a user looks: the router's token tables, /stats, its
Prometheus samples, `radixmesh stats`, the OpenAI usage's cached tokens and the metadata service's
hit reports on the wire."""

from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from radixmesh.cluster.cli.route_stats import render_stats
from radixmesh.cluster.observability.endpoints import stats_document
from radixmesh.cluster.router.metrics import RouterMetrics
from radixmesh.proto.ids import NodeId
from radixmesh.proto.metadata.codec import counters_from_pb, counters_to_pb, hits_from_pb, hits_to_pb
from radixmesh.proto.metadata.hits import HitCounters, RequestHits
from radixmesh.proto.serve.plan import ServeStats
from radixmesh.proto.serve.tokens import TokenSources

A = NodeId("node-a")
# 64 prompt tokens: 16 from the gpu, 32 read back from disk, 16 computed.
TOKENS = TokenSources.of_prompt(64, local_gpu=16, local_disk=32)


def served() -> RouterMetrics:
    metrics = RouterMetrics("m")
    stats = ServeStats(TOKENS, pull_bytes=0, pull_seconds=0.0, pull_failed=False, ttft_s=0.1, decode_s=0.1,
                       preemptions=0)
    metrics.record_served(A, stats, block_size=16, cluster_tokens=48, predicted_local_tokens=48, ttft_s=0.1)
    return metrics


def test_disk_hits_are_their_own_source_and_count_as_cached() -> None:
    assert TOKENS.local_disk == 32 and TOKENS.computed == 16 and TOKENS.hits == 48 and TOKENS.local == 48
    assert dict(TOKENS.items())["local_disk"] == 32


def test_router_stats_show_local_disk_as_a_local_hit() -> None:
    doc = stats_document(served(), None, policy="cost", active_policy="cost", metadata_available=True, inflight={})
    router = doc["router"]
    assert isinstance(router, dict)
    assert router["local_disk"] == 32 and router["local_host"] == 0 and router["computed"] == 16
    assert router["hit_rate_by_source"]["local_disk"] == 0.5 and router["hit_rate"] == 0.75
    # Disk is the node's own tier: a prediction of a local prefix there was realized, not regret.
    assert router["realized_local_tokens"] == 48 and router["regret_tokens"] == 0
    assert router["nodes"][A]["local_disk"] == 32


def test_router_metrics_label_local_disk() -> None:
    samples = {s.labels["source"]: s.value for f in text_string_to_metric_families(served().render())
               for s in f.samples if s.name == "radixmesh_prompt_tokens_total"}
    assert samples["local_disk"] == 32 and samples["local_host"] == 0


def test_radixmesh_stats_has_a_local_disk_column() -> None:
    doc = stats_document(served(), None, policy="cost", active_policy="cost", metadata_available=True, inflight={})
    console = Console(width=200, record=True)
    console.print(render_stats(doc))
    text = console.export_text()
    assert "local disk" in text and "50.0%" in text  # local disk's share of the prompt
    node_row = next(line for line in text.splitlines() if "node-a" in line)
    assert "48" in node_row  # local: gpu + disk


def test_hit_reports_carry_local_disk_over_the_wire() -> None:
    hits = RequestHits("r1", "t", TOKENS)
    assert hits_from_pb(hits_to_pb(hits)) == hits
    counters = HitCounters(requests=1, prompt_tokens=64, local_gpu_tokens=16, local_disk_tokens=32, miss_tokens=16)
    assert counters.hit_rate == 0.75
    assert counters_from_pb(counters_to_pb(counters)) == counters
