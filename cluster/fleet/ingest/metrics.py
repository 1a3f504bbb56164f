"""What following one engine's KV events looks like, as radixmesh metrics (metrics_exposition)."""

from dataclasses import dataclass

from radixmesh.cluster.fleet.ingest.block_map import EngineBlockMap
from radixmesh.cluster.fleet.ingest.subscriber import SubscriberStats
from radixmesh.common.metrics.exposition import metric

_SKIPPED_HELP = ("Engine blocks not indexed, by reason (lora, extra_keys, unknown_parent, medium, kv_group, "
                 "block_size, malformed)")


@dataclass(frozen=True, slots=True)
class IngestStats:
    kv_event_batches: int = metric("counter", "KV event batches applied, in sequence order")
    kv_event_gaps: int = metric("counter", "Sequence gaps seen in the engine's KV event stream")
    kv_event_restarts: int = metric("counter", "Engine restarts seen (its sequence numbers started again)")
    kv_event_replayed_batches: int = metric("counter", "Batches fetched from the engine's replay socket")
    kv_event_forgets: int = metric("counter", "Times the engine's indexed blocks were forgotten (a gap "
                                              "replay could not fill, a restart, an undecodable batch)")
    kv_event_bad_payloads: int = metric("counter", "KV event payloads that did not decode")
    kv_event_skipped_blocks: dict[str, int] = metric("counter", _SKIPPED_HELP, "reason")  # noqa: RUF009 (a field())
    external_engine_blocks: int = metric("gauge", "Engine blocks indexed as held now")


def ingest_stats(subscriber: SubscriberStats, blocks: EngineBlockMap) -> IngestStats:
    return IngestStats(subscriber.batches, subscriber.gaps, subscriber.restarts, subscriber.replayed_batches,
                       subscriber.forgets, subscriber.bad_payloads, dict(blocks.skipped), len(blocks))
