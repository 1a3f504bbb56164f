"""Attacks on the metadata service over real gRPC on 127.0.0.1, each refused while the honest node
keeps its lease and Match keeps answering correctly: unauthenticated calls, a live node's name taken
over, an epoch far in the future, a node speaking for another, NaN loads, oversized tenants, and a
poisoned parent link from one node."""

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import grpc
import pytest

from radixmesh.cluster.metadata.hit_accounting import OTHER_TENANTS, HitAccounting
from radixmesh.cluster.metadata.service import MetadataService
from radixmesh.common.metadata.auth import NO_CREDENTIALS, CallerCredentials
from radixmesh.common.metadata.client import MetadataClient
from radixmesh.common.secret import ClusterSecret
from radixmesh.proto import radixmesh_pb2 as pb
from radixmesh.proto import radixmesh_pb2_grpc as pb_grpc
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.events import BlockStored, Tier
from radixmesh.proto.ids import NodeId
from radixmesh.proto.metadata.hits import RequestHits
from radixmesh.proto.metadata.messages import EventBatch, MatchQuery
from radixmesh.proto.metadata.nodes import NodeInfo, NodeLoad
from radixmesh.proto.serve.tokens import TokenSources
from tests.support.servers import start_metadata_server

SECRET = ClusterSecret.generate()
L = "layout-0"
A, B = NodeId("node-1"), NodeId("node-2")
H = [BlockHash(bytes([i]) * 16) for i in range(8)]


def info(node: NodeId, epoch: int, address: str = "10.0.0.1:7000") -> NodeInfo:
    return NodeInfo(node, epoch, L, 16, 4096, address, 100)


class Cluster:
    """A secured service, the honest node A (registered, holding H[:4]) and the router's client."""

    def __init__(self, port: int, service: MetadataService) -> None:
        self.target = f"127.0.0.1:{port}"
        self.service = service
        self.epoch = time.time_ns() // 1000
        self.a = self.client(CallerCredentials.node(SECRET, A))
        self.router = self.client(CallerCredentials.cluster(SECRET))
        self._extra: list[MetadataClient] = []

    def client(self, credentials: CallerCredentials) -> MetadataClient:
        return MetadataClient(self.target, credentials=credentials, timeout_s=5.0)

    def intruder(self, credentials: CallerCredentials = NO_CREDENTIALS) -> MetadataClient:
        c = self.client(credentials)
        self._extra.append(c)
        return c

    async def holders(self) -> dict[str, int]:
        """Match of H as the router sees it: blocks per node."""
        [result] = await self.router.match([MatchQuery(L, tuple(H[:4]))])
        return {n.node_id: n.any_tier_blocks for n in result.nodes}

    async def honest_node_still_serves(self) -> None:
        """A's lease renews and Match routes H[:4] to A at its own address."""
        lease = await self.a.heartbeat(A, self.epoch, NodeLoad(queued_requests=1))
        assert lease.epoch == self.epoch
        [result] = await self.router.match([MatchQuery(L, tuple(H[:4]))])
        assert [(n.node_id, n.transfer_address, n.any_tier_blocks) for n in result.nodes] == [(A, "10.0.0.1:7000", 4)]
        self.service.check_invariants()

    async def close(self) -> None:
        for c in (self.a, self.router, *self._extra):
            await c.close()


@contextlib.asynccontextmanager
async def secured() -> AsyncIterator[Cluster]:
    service = MetadataService()
    server, port = await start_metadata_server(service, secret=SECRET)
    c = Cluster(port, service)
    try:
        await c.a.register(info(A, c.epoch))
        await c.a.publish([EventBatch(A, c.epoch, 1, (BlockStored(tuple(H[:4]), None, Tier.GPU),))])
        yield c
    finally:
        await c.close()
        await server.stop(None)


async def code_of(call: "asyncio.Future[object] | object") -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call  # type: ignore[misc]
    return err.value.code()


def run(body: object) -> None:
    asyncio.run(body())  # type: ignore[operator]


def test_unauthenticated_register_publish_match_are_refused() -> None:
    async def body() -> None:
        async with secured() as c:
            for creds in (NO_CREDENTIALS, CallerCredentials.cluster(ClusterSecret.generate()),
                          CallerCredentials.node(ClusterSecret.generate(), A)):
                x = c.intruder(creds)
                assert await code_of(x.register(info(B, c.epoch))) == grpc.StatusCode.UNAUTHENTICATED
                batch = EventBatch(A, c.epoch, 2, (BlockStored((H[5],), None, Tier.GPU),))
                assert await code_of(x.publish([batch])) == grpc.StatusCode.UNAUTHENTICATED
                assert await code_of(x.match([MatchQuery(L, (H[0],))])) == grpc.StatusCode.UNAUTHENTICATED
            assert [m.info.node_id for m in c.service.membership.members()] == [A]
            await c.honest_node_still_serves()

    run(body)


def test_a_live_nodes_name_cannot_be_taken_over() -> None:
    async def body() -> None:
        async with secured() as c:
            # Without A's credential: another node's, the cluster's, or none, with the highest epoch.
            for creds in (CallerCredentials.node(SECRET, B), CallerCredentials.cluster(SECRET), NO_CREDENTIALS):
                x = c.intruder(creds)
                hijack = x.register(info(A, c.epoch + 1, address="6.6.6.6:1"))
                assert await code_of(hijack) in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED)
                assert await code_of(x.heartbeat(A, c.epoch, NodeLoad())) in (
                    grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED)
            await c.honest_node_still_serves()

    run(body)


def test_an_epoch_ahead_of_the_clock_is_refused() -> None:
    async def body() -> None:
        async with secured() as c:
            # Even with the node's own credential: 2^64-1 would fence the name off for good.
            for epoch in (2**64 - 1, c.epoch + 3600 * 10**6):
                assert await code_of(c.a.register(info(A, epoch))) == grpc.StatusCode.INVALID_ARGUMENT
            await c.honest_node_still_serves()

    run(body)


def test_a_node_cannot_publish_or_snapshot_for_another() -> None:
    async def body() -> None:
        async with secured() as c:
            b = c.intruder(CallerCredentials.node(SECRET, B))
            await b.register(info(B, c.epoch, "10.0.0.2:7000"))
            forged = EventBatch(A, c.epoch, 2, (BlockStored((H[4],), H[3], Tier.GPU),))
            assert await code_of(b.publish([forged])) == grpc.StatusCode.PERMISSION_DENIED
            assert await c.holders() == {A: 4}
            await c.honest_node_still_serves()

    run(body)


@pytest.mark.parametrize("load", [
    pb.NodeLoad(prefill_tokens_per_s=float("nan")),
    pb.NodeLoad(prefill_tokens_per_s=float("inf")),
    pb.NodeLoad(pull_gbps={"node-2": float("nan")}),
    pb.NodeLoad(pull_gbps={"bad id with spaces": 1.0}),
])
def test_nan_or_infinite_load_is_refused(load: pb.NodeLoad) -> None:
    async def body() -> None:
        async with secured() as c:
            creds = CallerCredentials.node(SECRET, A).metadata
            async with grpc.aio.insecure_channel(c.target) as channel:
                stub = pb_grpc.MetadataServiceStub(channel)
                request = pb.HeartbeatRequest(node_id=A, epoch=c.epoch, load=load)
                assert await code_of(stub.Heartbeat(request, metadata=creds)) == grpc.StatusCode.INVALID_ARGUMENT
            assert c.service.membership.get(A).load == NodeLoad()  # type: ignore[union-attr]
            await c.honest_node_still_serves()

    run(body)


def test_oversized_tenant_is_refused_in_match_and_in_hit_reports() -> None:
    async def body() -> None:
        async with secured() as c:
            huge = "t" * (4 << 20)  # 4 MB: what one request's `user` once put into every heartbeat
            async with grpc.aio.insecure_channel(c.target, options=[("grpc.max_send_message_length", 64 << 20)]) as ch:
                stub = pb_grpc.MetadataServiceStub(ch)
                q = pb.MatchRequest(queries=[pb.MatchQuery(layout_fingerprint=L, hashes=[H[0]], tenant=huge)])
                meta = CallerCredentials.cluster(SECRET).metadata
                assert await code_of(stub.Match(q, metadata=meta)) in (
                    grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED)
            with pytest.raises(ValueError, match="tenant is at most 256"):
                RequestHits("r", huge, TokenSources(computed=16))
            ok = RequestHits("r1", "acme", TokenSources(computed=16))
            await c.a.heartbeat(A, c.epoch, NodeLoad(), [ok])
            assert c.service.hits.stats().per_tenant["acme"].requests == 1
            await c.honest_node_still_serves()

    run(body)


def test_a_poisoned_parent_link_from_one_node_does_not_block_another() -> None:
    async def body() -> None:
        async with secured() as c:
            b = c.intruder(CallerCredentials.node(SECRET, B))
            await b.register(info(B, c.epoch, "10.0.0.2:7000"))
            # B claims block H[5] hangs under H[7]; A's true chain says H[4] -> H[5].
            ack = await b.publish([EventBatch(B, c.epoch, 1, (BlockStored((H[5],), H[7], Tier.GPU),))])
            assert ack.next_seq == 2
            honest = EventBatch(A, c.epoch, 2, (BlockStored((H[4], H[5]), H[3], Tier.GPU),))
            assert (await c.a.publish([honest])).next_seq == 3
            [result] = await c.router.match([MatchQuery(L, tuple(H[:6]))])
            assert [(n.node_id, n.any_tier_blocks) for n in result.nodes] == [(A, 6)]
            assert result.cluster_blocks == 6
            # A node contradicting its own links is still refused, and only its batch.
            bad = EventBatch(A, c.epoch, 3, (BlockStored((H[5],), H[6], Tier.HOST),))
            assert await code_of(c.a.publish([bad])) == grpc.StatusCode.INVALID_ARGUMENT
            c.service.check_invariants()

    run(body)


def test_tenant_counters_are_bounded() -> None:
    acc = HitAccounting(max_tenants=2)
    for t in ("a", "b", "c", "d", "a"):
        acc.record(A, RequestHits("", t, TokenSources(computed=1)))
    assert {k: v.requests for k, v in acc.stats().per_tenant.items()} == {"a": 2, "b": 1, OTHER_TENANTS: 2}
