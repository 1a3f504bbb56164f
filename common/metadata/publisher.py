"""EventPublisher: keeps the metadata service's view of one node current.

It registers the node, sends its cache events in numbered batches (a gap or a fresh registration:
a full snapshot), heartbeats load, rates and realized hits, and registers again as a new
incarnation when its lease has ended. One lock keeps batches in order; failed rounds back off; what
waits is bounded; a round that raises is counted and backed off, never the end of the heartbeats.
The rules and why: docs/routing.md#the-nodes-event-publisher.
"""

import asyncio
import contextlib
import logging
import random
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Protocol

import grpc

from radixmesh.common.backoff import Backoff
from radixmesh.common.metadata.client import MetadataClient
from radixmesh.common.metrics.exposition import metric
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.events import BlockStored, CacheEvent
from radixmesh.proto.metadata.hits import RequestHits
from radixmesh.proto.metadata.limits import MAX_HITS_PER_HEARTBEAT
from radixmesh.proto.metadata.messages import EventBatch, NodeSnapshot, PublishStatus
from radixmesh.proto.metadata.nodes import Lease, NodeInfo, NodeLoad

logger = logging.getLogger(__name__)


class PendingHits:
    """Hit reports of finished requests waiting for a heartbeat, at most `limit`: past it the oldest
    are dropped (counted in `dropped`), so a node nobody heartbeats for keeps a bounded list."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        self._hits: deque[RequestHits] = deque(maxlen=limit)
        self.dropped = 0

    def add(self, hits: Iterable[RequestHits]) -> None:
        for h in hits:
            self.dropped += len(self._hits) == self._hits.maxlen  # the deque drops its oldest
            self._hits.append(h)

    def first(self, n: int) -> list[RequestHits]:
        """The oldest `n` (fewer if fewer wait), still pending."""
        return list(islice(self._hits, n))

    def remove_first(self, n: int) -> None:
        for _ in range(min(n, len(self._hits))):
            self._hits.popleft()

    def take(self) -> list[RequestHits]:
        """Every pending report, oldest first; none pending afterwards."""
        hits = list(self._hits)
        self._hits.clear()
        return hits

    def drop_all(self) -> None:
        self.dropped += len(self._hits)
        self._hits.clear()

    def __len__(self) -> int:
        return len(self._hits)


@dataclass(frozen=True, slots=True)
class PublisherStats:
    """What a node's publisher dropped or had to redo; every sample labelled `node`."""

    node: str
    hit_reports_dropped: int = metric(
        "counter", "Hit reports of finished requests dropped (the oldest first) while no heartbeat took "
        "them: standalone, a metadata outage or a stale publisher.")
    lease_expiries: int = metric(
        "counter", "Leases of this node the metadata service forgot (no heartbeat within its TTL: a "
        "partition, a stalled agent), each followed by registering again as a new incarnation.")


class PublishedNode(Protocol):
    """What the publisher reads from its node (NodeAgent implements it)."""

    def node_info(self) -> NodeInfo: ...

    async def take_events(self) -> list[CacheEvent]:
        """Drain the cache events since the last call."""
        ...

    async def wait_for_events(self) -> None:
        """Return once take_events may find events it did not last time (at once when the node cannot
        tell): what an idle publisher waits for instead of asking every publish interval."""
        ...

    async def snapshot(self) -> tuple[BlockStored, ...]:
        """Every cached block as chains; drains pending events in the same step (the snapshot covers them)."""
        ...

    async def load(self) -> NodeLoad: ...

    def take_hits(self) -> list[RequestHits]: ...

    async def recall(self, hashes: Sequence[BlockHash]) -> None:
        """The cluster evicted its last copy of `hashes` recently (a lease's `recalled`)."""
        ...

    def next_epoch(self) -> int:
        """Become a new incarnation: a strictly higher epoch, which node_info reports from now on."""
        ...


@dataclass(frozen=True, slots=True)
class PublisherConfig:
    publish_interval_s: float = 0.05
    heartbeat_interval_s: float = 1.0
    max_pending_batches: int = 256
    """Unacknowledged batches kept while the service is unreachable; past it they are dropped and a
    snapshot is sent once it is back."""
    max_backoff_s: float = 2.0
    """Longest wait between rounds while calls keep failing: long enough to spare a struggling
    service (40x fewer publish rounds than the default pace), short enough that a node is back in
    the index within a few seconds of the service (leases last 10 s by default)."""
    max_pending_hits: int = 4 * MAX_HITS_PER_HEARTBEAT
    """Hit reports kept while heartbeats fail (the oldest dropped first): four heartbeats' worth."""


class EventPublisher:
    """Publishes one node's events and heartbeats through `client` (which it closes on stop)."""

    def __init__(self, node: PublishedNode, client: MetadataClient, config: PublisherConfig,
                 rng: random.Random | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self._node = node
        self._rng = rng or random.Random()
        self._clock = clock
        self._client = client
        self.config = config
        info = node.node_info()
        self.node_id, self.epoch = info.node_id, info.epoch
        self._seq = 0
        """Last sequence number assigned to a batch (or covered by a snapshot)."""
        self._pending: list[EventBatch] = []
        self._hits = PendingHits(config.max_pending_hits)
        self._lease: Lease | None = None
        self._resync = False
        self._lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self.stale = False
        """A newer incarnation of this node registered: nothing more is sent."""
        self.registrations = 0
        self.snapshots = 0
        self.batches = 0
        self.failures = 0
        """Failed calls since the last successful one (what the backoff grows with)."""
        self.loop_errors = 0
        """Rounds that raised unexpectedly (the loop went on)."""
        self.lease_expiries = 0
        """Times the service forgot the lease and the node registered again."""
        self._renewed_at: float | None = None
        """When the lease was last granted or renewed (`clock`): how long a lost lease went unrenewed."""

    @property
    def lease(self) -> Lease | None:
        return self._lease

    @property
    def hits_dropped(self) -> int:
        """Hit reports this publisher dropped: past `max_pending_hits`, or taken once stale."""
        return self._hits.dropped

    async def start(self) -> None:
        """Start the publish and heartbeat loops (registration happens on their first round)."""
        self._tasks = [asyncio.create_task(self._every(self.config.publish_interval_s, self._publish)),
                       asyncio.create_task(self._every(self.config.heartbeat_interval_s, self.heartbeat))]

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        await self._client.close()

    async def flush(self) -> None:
        """Drain the node's new events and send every unacknowledged batch. A service that cannot be
        reached keeps them pending (retried next round); never raises for the service's faults."""
        async with self._lock:
            events = await self._node.take_events()
            if self.stale:
                return  # nobody will take them: drained all the same, so they do not pile up
            if events:
                self._seq += 1
                self._pending.append(EventBatch(self.node_id, self.epoch, self._seq, tuple(events)))
            if len(self._pending) > self.config.max_pending_batches:
                self._pending.clear()
                self._resync = True
            with self._on_rpc_error("publish"):
                await self._ensure_registered()
                if self._resync:
                    await self._send_snapshot()
                elif self._pending:
                    ack = await self._client.publish(self._pending)
                    self.batches += len(self._pending)
                    if ack.status is PublishStatus.RESYNC:
                        await self._send_snapshot()
                    else:
                        self._pending = [b for b in self._pending if b.seq >= ack.next_seq]

    async def _publish(self) -> None:
        """One round of the publish loop: a flush, then, when it left nothing to send again, a wait
        until the node may have new events. The loop's interval follows the wait, so what a burst
        makes still leaves in one batch, within an interval; an idle node's loop sleeps instead of
        waking every interval to find nothing."""
        await self.flush()
        if self._lease is not None and not (self._pending or self._resync or self.failures):
            # At most a heartbeat interval: what a heartbeat leaves for this loop (a snapshot owed to
            # a standby that took over, a registration once the lease ended) goes out within one,
            # however quiet the node.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.config.heartbeat_interval_s):
                    await self._node.wait_for_events()

    async def heartbeat(self) -> None:
        """Renew the lease with the node's load and the hits of requests finished since the last beat."""
        async with self._lock:
            self._hits.add(self._node.take_hits())
            if self.stale:
                self._hits.drop_all()  # nobody will send them
                return
            with self._on_rpc_error("heartbeat"):
                await self._ensure_registered()
                load = await self._node.load()
                send = self._hits.first(MAX_HITS_PER_HEARTBEAT)
                self._lease = await self._client.heartbeat(self.node_id, self.epoch, load, send)
                self._renewed_at = self._clock()
                self._hits.remove_first(len(send))
                if self._lease.recalled:
                    await self._node.recall(self._lease.recalled)
                # A standby that took over restored the index as last persisted, so it may expect an
                # earlier batch than our next one; an idle node publishes nothing to learn of the gap.
                first_pending = self._pending[0].seq if self._pending else self._seq + 1
                if self._lease.next_seq != first_pending:
                    self._resync = True

    async def _ensure_registered(self) -> None:
        if self._lease is not None:
            return
        self._lease = await self._client.register(self._node.node_info())
        self._renewed_at = self._clock()
        self.registrations += 1
        logger.info("node %s registered (epoch %d, snapshot required: %s)", self.node_id, self.epoch,
                    self._lease.snapshot_required)
        # The service expects `next_seq`; unless that is exactly our first unacknowledged batch (or the
        # next one), it lost or never saw some of our batches, and only a snapshot can repair that.
        first_pending = self._pending[0].seq if self._pending else self._seq + 1
        if self._lease.snapshot_required or self._lease.next_seq != first_pending:
            self._seq = max(self._seq, self._lease.next_seq - 1)
            await self._send_snapshot()

    async def _send_snapshot(self) -> None:
        snapshot = NodeSnapshot(self.node_id, self.epoch, self._seq, await self._node.snapshot())
        await self._client.sync_snapshot(snapshot)
        self.snapshots += 1
        self._pending.clear()
        self._resync = False

    def next_delay(self, interval_s: float) -> float:
        """How long a loop of period `interval_s` waits before its next round."""
        if not self.failures:
            return interval_s
        # the first failed round already waits twice the interval: n failures grow it 2 ** n times
        grown = Backoff(interval_s, max(interval_s, self.config.max_backoff_s)).pause(self.failures + 1)
        return max(interval_s, grown * (0.5 + 0.5 * self._rng.random()))

    @contextlib.contextmanager
    def _on_rpc_error(self, what: str) -> Iterator[None]:
        try:
            yield
            self.failures = 0
        except grpc.aio.AioRpcError as e:
            self.failures += 1
            code = e.code()
            if code is grpc.StatusCode.NOT_FOUND:
                self._lease_expired()
            elif code is grpc.StatusCode.FAILED_PRECONDITION:
                logger.error("node %s epoch %d is stale (a newer incarnation exists): %s", self.node_id,
                             self.epoch, e.details())
                self.stale = True
            elif code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED):
                # Resending the same batches would fail the same way: start over from a snapshot.
                logger.error("%s refused by the metadata service: %s %s", what, code, e.details())
                self._pending.clear()
                self._resync = True
            else:
                logger.warning("%s to the metadata service failed: %s %s", what, code, e.details())

    def _lease_expired(self) -> None:
        """A warning, not info: the index dropped this node's blocks meanwhile, so routing missed them
        until the snapshot that follows; repeated, it points at a partition or a stalled agent."""
        self.lease_expiries += 1
        ttl = f"{self._lease.ttl_s:g} s" if self._lease is not None else "unknown"
        since = (f"{self._clock() - self._renewed_at:.1f} s ago" if self._renewed_at is not None
                 else "never")
        self.epoch = self._node.next_epoch()
        logger.warning("node %s: its lease expired at the metadata service (last heartbeat renewed it %s, "
                       "lease TTL %s); registering again as epoch %d with a full snapshot", self.node_id, since,
                       ttl, self.epoch)
        self._lease = None
        self._seq = 0
        self._pending.clear()
        self._resync = True

    async def _every(self, interval_s: float, fn: "_Round") -> None:
        while True:
            try:
                await fn()
            except Exception:
                self.loop_errors += 1
                self.failures += 1
                logger.exception("node %s: a %s round failed unexpectedly; backing off", self.node_id,
                                 getattr(fn, "__name__", "publisher"))
            await asyncio.sleep(self.next_delay(interval_s))


class _Round(Protocol):
    async def __call__(self) -> None: ...

