"""Stand-ins on both sides of an EventPublisher: a node whose lists the test fills, and a metadata
client that answers or fails as the test says."""

import asyncio
from collections.abc import Sequence

import grpc

from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.events import BlockStored, CacheEvent
from radixmesh.proto.ids import NodeId
from radixmesh.proto.metadata.hits import RequestHits
from radixmesh.proto.metadata.messages import EventBatch, NodeSnapshot, PublishAck, PublishStatus
from radixmesh.proto.metadata.nodes import Lease, NodeInfo, NodeLoad

A = NodeId("a")


class Node:
    """A PublishedNode whose lists grow until the publisher takes them. Its `wait_for_events` returns
    once the test sets `stirred` (each take clears it, as the agent's does)."""

    def __init__(self) -> None:
        self.events: list[CacheEvent] = []
        self.hits: list[RequestHits] = []
        self.stirred = asyncio.Event()
        self.takes = 0
        self.waits = 0
        """Calls of take_events, and of wait_for_events (counted as they start)."""

    def node_info(self) -> NodeInfo:
        return NodeInfo(A, 1, "L", 16, 4096, "x", 100)

    async def take_events(self) -> list[CacheEvent]:
        self.takes += 1
        self.stirred.clear()
        events, self.events = self.events, []
        return events

    async def wait_for_events(self) -> None:
        self.waits += 1
        await self.stirred.wait()

    async def snapshot(self) -> tuple[BlockStored, ...]:
        self.events = []
        return ()

    async def load(self) -> NodeLoad:
        return NodeLoad()

    def take_hits(self) -> list[RequestHits]:
        taken, self.hits = self.hits, []
        return taken

    async def recall(self, hashes: Sequence[BlockHash]) -> None:
        pass

    def next_epoch(self) -> int:
        return 2


class Service:
    """A MetadataClient stand-in: every call fails with `failing` (None: answers); heartbeats and
    published batches kept, snapshots counted. Its leases always expect batch 1 next."""

    def __init__(self) -> None:
        self.failing: grpc.StatusCode | None = None
        self.beats: list[list[str]] = []
        self.published: list[EventBatch] = []
        self.snapshots = 0

    def _check(self) -> None:
        if self.failing is not None:
            raise grpc.aio.AioRpcError(self.failing, details="refused by the test")

    async def register(self, info: NodeInfo) -> Lease:
        self._check()
        return Lease(A, 1, 10.0, 1, snapshot_required=False)

    async def heartbeat(self, node: NodeId, epoch: int, load: NodeLoad, hits: Sequence[RequestHits]) -> Lease:
        self._check()
        self.beats.append([h.request_id for h in hits])
        return Lease(A, 1, 10.0, 1, snapshot_required=False)

    async def publish(self, batches: Sequence[EventBatch]) -> PublishAck:
        self._check()
        self.published += [b for b in batches if b not in self.published]
        return PublishAck(PublishStatus.OK, batches[-1].seq + 1)

    async def sync_snapshot(self, snapshot: NodeSnapshot) -> PublishAck:
        self._check()
        self.snapshots += 1
        return PublishAck(PublishStatus.OK, snapshot.seq + 1)

    async def close(self) -> None:
        pass
