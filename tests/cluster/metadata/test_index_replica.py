"""The router's index replica: the service's feed (snapshot, then ordered updates) keeps an
IndexReplica answering Match as the service does; gaps and slow watchers get a fresh snapshot; leases
that end reach the replica; over real gRPC on 127.0.0.1 a router routes on it without Match."""

import asyncio
import contextlib
import random

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixmesh.cluster.metadata.feed import Subscription
from radixmesh.cluster.metadata.membership import StaleEpoch, UnknownNode
from radixmesh.cluster.metadata.replica import IndexReplica, ReplicaGap
from radixmesh.cluster.metadata.server import MetadataServer
from radixmesh.cluster.metadata.service import MetadataService
from radixmesh.cluster.metadata.service_config import ServiceConfig
from radixmesh.cluster.router.index_watch import IndexWatcher
from radixmesh.common.metadata.auth import CallerCredentials
from radixmesh.common.metadata.client import MetadataClient
from radixmesh.common.secret import ClusterSecret
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.events import AllCleared, BlockRemoved, BlockStored, Tier
from radixmesh.proto.ids import NodeId
from radixmesh.proto.metadata.messages import (
    EventBatch,
    IndexUpdate,
    MatchPrediction,
    MatchQuery,
    MatchResult,
    NodeSnapshot,
)
from radixmesh.proto.metadata.nodes import NodeInfo, NodeLoad
from tests.support.hashes import h
from tests.support.poll import until
from tests.support.servers import start_metadata_server

L = "layout-replica"
NODES = [NodeId(f"n{i}") for i in range(4)]
TTL = 10.0
REFUSED = (ValueError, StaleEpoch, UnknownNode)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def info(node: NodeId, epoch: int = 1) -> NodeInfo:
    return NodeInfo(node, epoch, L, 16, 4096, f"ucx://{node}", 1000)


def holders(result: MatchResult) -> MatchResult:
    """A Match answer with nodes in a canonical order (equal prefix lengths may come in any order)."""
    return MatchResult(result.cluster_blocks, tuple(sorted(result.nodes, key=lambda n: n.node_id)))


def feed_replica(replica: IndexReplica, sub: Subscription, service: MetadataService) -> None:
    """Apply everything queued for `sub`, or a fresh snapshot when it fell behind."""
    batch = sub.take()
    for update in batch if batch is not None else [service.resnapshot(sub)]:
        replica.apply(update)


# --- unit: the feed and the replica, no network ----------------------------------------------------
def chain(start: int, length: int) -> tuple[BlockHash, ...]:
    """Blocks of the path 0 -> 1 -> ... cut at [start, start + length): a prefix tree of one branch
    per `start % 3` so that nodes hold overlapping and diverging prefixes."""
    branch = start % 3
    return tuple(h(1000 * branch + i) if i else h(0) for i in range(start, start + length))


ops = st.lists(
    st.one_of(
        st.tuples(st.just("register"), st.integers(0, 3), st.integers(1, 3)),
        st.tuples(st.just("store"), st.integers(0, 3), st.integers(0, 6), st.integers(1, 5), st.booleans()),
        st.tuples(st.just("remove"), st.integers(0, 3), st.integers(0, 8), st.booleans()),
        st.tuples(st.just("clear"), st.integers(0, 3)),
        st.tuples(st.just("snapshot"), st.integers(0, 3), st.integers(0, 6), st.integers(1, 5)),
        st.tuples(st.just("heartbeat"), st.integers(0, 3), st.integers(0, 9)),
        st.tuples(st.just("tick"), st.floats(0.0, 6.0)),
        st.tuples(st.just("gap"), st.integers(0, 3)),
        st.tuples(st.just("late_watcher")),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(ops, st.lists(st.tuples(st.integers(0, 8), st.integers(1, 9)), min_size=1, max_size=6))
def test_replica_answers_match_as_the_service_does(steps: list[tuple], queries: list[tuple[int, int]]) -> None:
    clock = Clock()
    service = MetadataService(config=ServiceConfig(lease_ttl_s=TTL, watch_backlog=8), clock=clock)
    sub, first = service.watch()
    replica = IndexReplica()
    replica.apply(first)
    late: list[tuple[Subscription, IndexReplica]] = []
    epochs = dict.fromkeys(NODES, 0)
    seqs = dict.fromkeys(NODES, 0)

    def send(node: NodeId, events: tuple) -> None:
        # No lease (never registered or expired), or a chain refused: nothing changes.
        with contextlib.suppress(*REFUSED):
            service.publish(EventBatch(node, epochs[node], seqs[node] + 1, events))
            seqs[node] += 1

    for step in steps:
        kind, *args = step
        if kind == "register":
            node = NODES[args[0]]
            epochs[node] = max(epochs[node], args[1])
            with contextlib.suppress(*REFUSED):
                lease = service.register(info(node, epochs[node]))
                seqs[node] = lease.next_seq - 1
        elif kind == "store":
            node, start, length, host = NODES[args[0]], args[1], args[2], args[3]
            hashes = chain(start, length)
            parent = chain(start - 1, 1)[0] if start else None
            send(node, (BlockStored(hashes, parent, Tier.HOST if host else Tier.GPU),))
        elif kind == "remove":
            send(NODES[args[0]], (BlockRemoved(chain(args[1], 2), Tier.HOST if args[2] else Tier.GPU),))
        elif kind == "clear":
            send(NODES[args[0]], (AllCleared(),))
        elif kind == "snapshot":
            node = NODES[args[0]]
            parent = chain(args[1] - 1, 1)[0] if args[1] else None
            with contextlib.suppress(*REFUSED):
                seqs[node] += 1
                service.sync_snapshot(NodeSnapshot(node, epochs[node], seqs[node],
                                                   (BlockStored(chain(args[1], args[2]), parent, Tier.GPU),)))
        elif kind == "heartbeat":
            with contextlib.suppress(*REFUSED):
                service.heartbeat(NODES[args[0]], epochs[NODES[args[0]]], NodeLoad(queued_requests=args[1]))
        elif kind == "tick":
            clock.now += args[0]
            service.tick()
        elif kind == "gap":  # the watcher lost an update: it must notice and resync from a snapshot
            if replica.seq is not None and replica.seq > 0:
                replica.seq -= 1
                service.feed.record()  # an empty change: the next update the watcher reads
                with pytest.raises(ReplicaGap):
                    feed_replica(replica, sub, service)
                assert not replica.in_sync
                sub.restart()
                replica.apply(service.snapshot_update())
        else:
            s2, first2 = service.watch()
            r2 = IndexReplica()
            r2.apply(first2)
            late.append((s2, r2))
        feed_replica(replica, sub, service)
        for s2, r2 in late:
            feed_replica(r2, s2, service)
    service.check_invariants()
    for r in (replica, *(r2 for _, r2 in late)):
        r.check_invariants()
        assert r.seq == service.feed.seq
        assert {w.node_id for w in r.nodes()} == {m.info.node_id for m in service.membership.members()}
        for start, length in queries:
            q = chain(start, length) if start % 4 else (h(0), *chain(1, length))
            [want] = service.match([MatchQuery(L, q)])
            assert holders(r.match(L, q)) == holders(want)


def test_a_watcher_that_falls_behind_gets_a_snapshot_not_the_updates() -> None:
    service = MetadataService(config=ServiceConfig(watch_backlog=2))
    sub, first = service.watch()
    assert first.reset and first.seq == 0
    for i, node in enumerate(NODES):
        service.register(info(node))
        assert sub.behind == (i >= 2)
    assert sub.take() is None
    snap = service.resnapshot(sub)
    assert snap.reset and snap.seq == service.feed.seq == 4 and {n.node_id for n in snap.nodes} == set(NODES)
    assert sub.take() == [] and not sub.behind


def test_an_ended_lease_reaches_the_replica_as_a_left_node() -> None:
    clock = Clock()
    service = MetadataService(config=ServiceConfig(lease_ttl_s=TTL), clock=clock)
    sub, first = service.watch()
    replica = IndexReplica()
    replica.apply(first)
    service.register(info(NODES[0]))
    service.publish(EventBatch(NODES[0], 1, 1, (BlockStored((h(0), h(1)), None, Tier.GPU),)))
    feed_replica(replica, sub, service)
    assert replica.match(L, [h(0), h(1)]).nodes[0].any_tier_blocks == 2
    clock.now += TTL
    service.tick()
    [update] = sub.take() or []
    assert update.left == (NODES[0],)
    replica.apply(update)
    assert replica.match(L, [h(0), h(1)]) == MatchResult(0, ()) and not replica.is_live(NODES[0])


def test_an_update_from_another_incarnation_is_a_gap() -> None:
    replica = IndexReplica()
    replica.apply(IndexUpdate(5, reset=True, incarnation="one"))
    with pytest.raises(ReplicaGap):
        replica.apply(IndexUpdate(6, incarnation="two"))
    assert not replica.in_sync


# --- service: real gRPC on 127.0.0.1 ---------------------------------------------------------------


async def serve(service: MetadataService) -> tuple[MetadataServer, str]:
    server, port = await start_metadata_server(service)
    return server, f"127.0.0.1:{port}"


@pytest.mark.integration
def test_watch_over_grpc_follows_events_leases_and_resyncs_after_a_gap() -> None:
    async def body() -> None:
        clock = Clock()
        service = MetadataService(config=ServiceConfig(lease_ttl_s=TTL), clock=clock)
        server, target = await serve(service)
        client = MetadataClient(target)
        watcher = IndexWatcher(client, retry_s=0.01)
        try:
            await client.register(info(NODES[0]))
            watcher.start()
            replica = watcher.replica
            await until(lambda: replica.seq == service.feed.seq)
            rng = random.Random(1)
            for seq in range(1, 40):
                start = rng.randrange(6)
                parent = chain(start - 1, 1)[0] if start else None
                await client.publish([EventBatch(NODES[0], 1, seq, (BlockStored(chain(start, 3), parent, Tier.GPU),))])
            await until(lambda: replica.seq == service.feed.seq)
            q = (h(0), *chain(1, 8))
            assert holders(replica.match(L, q)) == holders(service.match([MatchQuery(L, q)])[0])
            # A lost update: the watcher notices the gap, watches again and is back in sync.
            assert replica.seq is not None
            replica.seq -= 1
            await client.heartbeat(NODES[0], 1, NodeLoad(queued_requests=3))
            await until(lambda: watcher.snapshots == 2 and replica.seq == service.feed.seq)
            assert replica.node(NODES[0]) is not None and replica.node(NODES[0]).load.queued_requests == 3  # type: ignore[union-attr]
            # The lease ends: the service's next call drops the node, and so does the replica.
            clock.now += TTL
            await client.stats()
            await until(lambda: not replica.is_live(NODES[0]))
            assert replica.match(L, q) == MatchResult(0, ())
            # A stopping service ends the stream: the replica stops answering.
            await server.stop(0)
            await until(lambda: not replica.in_sync)
        finally:
            await watcher.close()
            await client.close()
            await server.stop(0)

    asyncio.run(body())


@pytest.mark.integration
def test_watch_and_reports_need_the_cluster_credential() -> None:
    async def body() -> None:
        secret = ClusterSecret.generate()
        service = MetadataService()
        server, port = await start_metadata_server(service, secret=secret)
        anonymous = MetadataClient(f"127.0.0.1:{port}")
        router = MetadataClient(f"127.0.0.1:{port}", credentials=CallerCredentials.cluster(secret))
        try:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                async for _ in anonymous.watch_index():
                    pass
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await anonymous.report_predictions([MatchPrediction("r", 16, {})])
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert service.feed.watchers == 0
            stream = router.watch_index()
            first = await anext(stream)
            assert first.reset and service.feed.watchers == 1
            await stream.aclose()
        finally:
            await anonymous.close()
            await router.close()
            await server.stop(0)

    asyncio.run(body())
