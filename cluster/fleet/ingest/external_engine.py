"""An external engine (vLLM, SGLang) as a node of the cluster.

`ExternalEngine` follows the engine's KV events (KVEventSubscriber), translates them
(EngineBlockMap) and publishes them through the same EventPublisher the node agents use, so the
metadata service registers the engine as a node, indexes its blocks and answers Match with it; its
heartbeats carry the load read from the engine's `/metrics`. The router reaches the engine through
`cluster.fleet.engine_client.EngineAgentClient`.

An engine registers with an empty transfer address: nobody pulls from it, and routing it with
`cost_no_pull` pulls nothing into it either (we do not own its memory).
"""

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import aiohttp

from radixmesh.cluster.fleet.ingest.block_map import EngineBlockMap
from radixmesh.cluster.fleet.ingest.engine_metrics import EngineMetrics, parse_engine_metrics
from radixmesh.cluster.fleet.ingest.subscriber import KVEventSubscriber, SubscriberConfig
from radixmesh.common.metadata.client import MetadataClient
from radixmesh.common.metadata.publisher import EventPublisher, PublisherConfig
from radixmesh.common.metrics.exposition import metric, render_prometheus
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.events import BlockStored, CacheEvent
from radixmesh.proto.ids import NodeId
from radixmesh.proto.metadata.hits import RequestHits
from radixmesh.proto.metadata.nodes import NodeInfo, NodeLoad
from radixmesh.proto.vllm_kv_events import VllmEventBatch

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ExternalEngineConfig:
    """One engine: where it serves, where it publishes, and the layout partition it joins."""

    node_id: NodeId
    openai_url: str
    """Base URL of its OpenAI server, e.g. http://10.0.0.5:8000 (`/v1/completions` and `/metrics` under it)."""
    events: SubscriberConfig
    layout: str
    """The router's layout fingerprint: the engine's blocks are matched in that partition."""
    model: str
    """The model name the engine serves (the `model` of its requests)."""
    block_size: int = 16
    """The router's block size; the engine's must be a multiple of it."""
    block_bytes: int = 2 << 20
    """KV bytes of one of our blocks on this engine (Llama-3-8B, bf16, 16 tokens: 2 MiB)."""
    capacity_blocks: int = 0
    """Our blocks the engine's KV cache holds (heartbeats report free = (1 - usage) x this)."""
    hash_key: bytes = b""
    """The cluster's block-hash key (the router's)."""
    prefill_tokens_per_s: float = 0.0
    """Its prefill rate for the cost model; 0: the router's default."""
    metrics_timeout_s: float = 1.0
    publisher: PublisherConfig = field(default_factory=PublisherConfig)
    api_key: str = field(default="", repr=False)
    """The engine's API key (`vllm serve --api-key`), sent as a bearer token on every call to it; "":
    none. Out of repr: configs are logged."""

    def __post_init__(self) -> None:
        if not self.openai_url.startswith(("http://", "https://")):
            raise ValueError(f"openai_url must be an http(s) URL, got {self.openai_url!r}")
        if self.block_size < 1 or self.capacity_blocks < 0 or not self.metrics_timeout_s > 0:
            raise ValueError("block_size must be >= 1, capacity_blocks >= 0 and metrics_timeout_s > 0")
        if not self.model or not self.layout:
            raise ValueError("model and layout must be non-empty")

    @property
    def base_url(self) -> str:
        return self.openai_url.rstrip("/")

    @property
    def headers(self) -> dict[str, str]:
        """What every request to the engine carries: its API key, when it has one."""
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


class LazySession:
    """One aiohttp session per engine, made on first use (`get`) unless one was given, closed with
    `close`: a ClientSession must be created inside the event loop that uses it, and an engine's
    clients (ExternalEngineNode, EngineAgentClient) are built before that loop runs."""

    def __init__(self, session: aiohttp.ClientSession | None = None) -> None:
        self._session = session

    def get(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        return self._session

    async def close(self) -> None:
        """Idempotent; a later `get` makes a new session."""
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()


class ExternalEngineNode:
    """The engine as the EventPublisher sees a node (common.metadata.publisher.PublishedNode)."""

    def __init__(self, config: ExternalEngineConfig, *, publishing: bool = True,
                 session: aiohttp.ClientSession | None = None) -> None:
        """`publishing` False: nothing takes events and hits (no metadata service), so none are kept."""
        self.config = config
        self._publishing = publishing
        self.blocks = EngineBlockMap(config.block_size, hash_key=config.hash_key)
        self.epoch = time.time_ns() // 1000
        self.metrics = EngineMetrics()
        """Its last /metrics reading."""
        self.metrics_failures = 0
        self._metrics_failing = False
        self._events: list[CacheEvent] = []
        self._hits: list[RequestHits] = []
        self._session = LazySession(session)

    # --- fed by the subscriber and the engine client -------------------------------------------
    def on_batch(self, batch: VllmEventBatch) -> None:
        events = self.blocks.apply(batch.events)
        if self._publishing:
            self._events += events

    def on_gap(self) -> None:
        events = self.blocks.forget_holdings()
        if self._publishing:
            self._events += events

    def record_hits(self, hits: RequestHits) -> None:
        if self._publishing:
            self._hits.append(hits)

    # --- PublishedNode -------------------------------------------------------------------------
    def node_info(self) -> NodeInfo:
        c = self.config
        return NodeInfo(c.node_id, self.epoch, c.layout, c.block_size, c.block_bytes, "", c.capacity_blocks)

    async def take_events(self) -> list[CacheEvent]:
        events, self._events = self._events, []
        return events

    async def wait_for_events(self) -> None:
        pass  # at once: the publisher asks every interval, as before agents learned to wait

    async def snapshot(self) -> tuple[BlockStored, ...]:
        self._events = []
        return tuple(self.blocks.chains())

    async def load(self) -> NodeLoad:
        """The last reading of /metrics (ExternalEngine refreshes it on its own loop, so a slow
        engine never holds up the publisher, whose lock also orders the event batches)."""
        m = self.metrics
        free = round((1.0 - m.kv_usage) * self.config.capacity_blocks)
        return NodeLoad(queued_requests=m.waiting + m.running, free_blocks=free,
                        prefill_tokens_per_s=self.config.prefill_tokens_per_s)

    def take_hits(self) -> list[RequestHits]:
        hits, self._hits = self._hits, []
        return hits

    async def recall(self, hashes: Sequence[BlockHash]) -> None:
        """The engine evicts in its own order: the cluster's ghost is of no use to it."""

    def next_epoch(self) -> int:
        """A new incarnation (the service forgot this node's lease while the engine kept running): a
        strictly higher epoch, which node_info reports from now on. The publisher then registers
        again and resyncs the whole block map."""
        self.epoch = max(time.time_ns() // 1000, self.epoch + 1)
        return self.epoch

    async def refresh_metrics(self) -> EngineMetrics:
        url = f"{self.config.base_url}/metrics"
        try:
            session = self._session.get()
            timeout = aiohttp.ClientTimeout(total=self.config.metrics_timeout_s)
            async with session.get(url, timeout=timeout, headers=self.config.headers) as r:
                r.raise_for_status()
                self.metrics = parse_engine_metrics(await r.text())
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            if not self._metrics_failing:  # once per outage, not once per heartbeat
                logger.warning("%s: %s unreadable (%s); load stays as last read", self.config.node_id, url, e)
            self._metrics_failing = True
            self.metrics_failures += 1
            return self.metrics
        if self._metrics_failing:
            logger.info("%s: %s readable again", self.config.node_id, url)
        self._metrics_failing = False
        return self.metrics

    async def close(self) -> None:
        await self._session.close()


class ExternalEngine:
    """Subscriber + translator + publisher for one engine. `await start()`, then `await stop()`.

    `metadata` None: the block map is kept current but nothing is published (standalone, tests).
    The publisher closes `metadata` when it stops.
    """

    def __init__(self, config: ExternalEngineConfig, metadata: MetadataClient | None) -> None:
        self.config = config
        self.node = ExternalEngineNode(config, publishing=metadata is not None)
        self.subscriber = KVEventSubscriber(config.events, self.node.on_batch, self.node.on_gap)
        self.publisher = EventPublisher(self.node, metadata, config.publisher) if metadata is not None else None
        self._metrics_task: asyncio.Task[None] | None = None

    @property
    def node_id(self) -> NodeId:
        return self.config.node_id

    async def start(self) -> None:
        await self.node.refresh_metrics()
        await self.subscriber.start()
        if self.publisher is not None:
            await self.publisher.start()
        self._metrics_task = asyncio.create_task(self._poll_metrics(), name=f"metrics {self.node_id}")
        logger.info("external engine %s: events from %s, requests to %s", self.node_id,
                    self.config.events.endpoint, self.config.base_url)

    async def stop(self) -> None:
        if self._metrics_task is not None:
            self._metrics_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._metrics_task
            self._metrics_task = None
        await self.subscriber.stop()
        if self.publisher is not None:
            await self.publisher.stop()
        await self.node.close()

    async def _poll_metrics(self) -> None:
        while True:
            await asyncio.sleep(self.config.publisher.heartbeat_interval_s)
            await self.node.refresh_metrics()

    def prometheus_text(self) -> str:
        """How following its events goes (radixmesh_kv_event_*), in Prometheus text format."""
        return render_prometheus([ingest_stats(self.subscriber, self.node.blocks)],
                                 {"model_name": self.config.model})


_SKIPPED_HELP = ("Engine blocks not indexed, by reason (lora, extra_keys, unknown_parent, medium, kv_group, "
                 "block_size, malformed)")


@dataclass(frozen=True, slots=True)
class IngestStats:
    """What following one engine's KV events looks like, as radixmesh metrics
    (common/metrics/exposition.py)."""

    kv_event_batches: int = metric("counter", "KV event batches applied, in sequence order")
    kv_event_gaps: int = metric("counter", "Sequence gaps seen in the engine's KV event stream")
    kv_event_restarts: int = metric("counter", "Engine restarts seen (its sequence numbers started again)")
    kv_event_replayed_batches: int = metric("counter", "Batches fetched from the engine's replay socket")
    kv_event_forgets: int = metric("counter", "Times the engine's indexed blocks were forgotten (a gap "
                                              "replay could not fill, a restart, an undecodable batch)")
    kv_event_bad_payloads: int = metric("counter", "KV event payloads that did not decode")
    kv_event_malformed_messages: int = metric("counter", "KV event messages dropped for their framing (not "
                                                         "topic, seq, payload; a seq that is not 8 bytes)")
    kv_event_ingest_restarts: int = metric("counter", "Times following the engine's KV events failed "
                                                      "unexpectedly and started again (its blocks forgotten)")
    kv_event_skipped_blocks: dict[str, int] = metric("counter", _SKIPPED_HELP, "reason")  # noqa: RUF009 (a field())
    external_engine_blocks: int = metric("gauge", "Engine blocks indexed as held now")
    kv_event_dropped_connections: int = metric("counter", "Connections to the engine's KV event socket that "
                                                          "ended (a frame over the bound, the engine gone)")


def ingest_stats(subscriber: KVEventSubscriber, blocks: EngineBlockMap) -> IngestStats:
    s = subscriber.stats
    return IngestStats(s.batches, s.gaps, s.restarts, s.replayed_batches, s.forgets, s.bad_payloads,
                       s.malformed_messages, subscriber.task.restarts, dict(blocks.skipped), len(blocks),
                       s.dropped_connections)
