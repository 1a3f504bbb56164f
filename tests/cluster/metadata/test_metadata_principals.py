"""Who may call what on the metadata service, over real gRPC on 127.0.0.1: the cluster-scoped RPCs
(Match, GetStats, WatchIndex, ReportPredictions) only with the cluster credential, never with a
node's (seen on the wire without TLS) nor with another purpose's token; and every figure a router
reports is bounded and names live nodes, a refused report changing nothing."""

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc
import pytest

from radixmesh.cluster.metadata.service import MetadataService
from radixmesh.common.metadata.auth import TOKEN_METADATA_KEY, CallerCredentials
from radixmesh.common.metadata.client import MetadataClient
from radixmesh.common.metrics.scrape import metrics_token
from radixmesh.common.secret import ClusterSecret
from radixmesh.proto import radixmesh_pb2 as pb
from radixmesh.proto import radixmesh_pb2_grpc as pb_grpc
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.events import BlockStored, Tier
from radixmesh.proto.ids import NodeId
from radixmesh.proto.metadata.hits import MAX_PROMPT_TOKENS, RequestHits
from radixmesh.proto.metadata.messages import EventBatch, IndexUpdate, MatchPrediction, MatchQuery
from radixmesh.proto.metadata.nodes import NodeInfo, NodeLoad
from radixmesh.proto.serve.tokens import TokenSources
from tests.support.servers import start_metadata_server

pytestmark = pytest.mark.integration

SECRET = ClusterSecret.generate()
L = "layout-0"
A, GONE = NodeId("node-1"), NodeId("node-9")
H = [BlockHash(bytes([i]) * 16) for i in range(1, 5)]


class Cluster:
    """A secured service with node A registered (holding H) and clients made on demand."""

    def __init__(self, port: int, service: MetadataService) -> None:
        self.target = f"127.0.0.1:{port}"
        self.service = service
        self.epoch = time.time_ns() // 1000
        self._clients: list[MetadataClient] = []

    def client(self, credentials: CallerCredentials) -> MetadataClient:
        c = MetadataClient(self.target, credentials=credentials, timeout_s=5.0)
        self._clients.append(c)
        return c

    async def close(self) -> None:
        for c in self._clients:
            await c.close()


@contextlib.asynccontextmanager
async def secured() -> AsyncIterator[Cluster]:
    service = MetadataService()
    server, port = await start_metadata_server(service, secret=SECRET)
    c = Cluster(port, service)
    node = c.client(CallerCredentials.node(SECRET, A))
    try:
        await node.register(NodeInfo(A, c.epoch, L, 16, 4096, "10.0.0.1:7000", 100))
        await node.publish([EventBatch(A, c.epoch, 1, (BlockStored(tuple(H), None, Tier.GPU),))])
        yield c
    finally:
        await c.close()
        await server.stop(None)


async def code_of(call: Awaitable[object]) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    return err.value.code()


async def first_update(client: MetadataClient) -> IndexUpdate:
    async for update in client.watch_index():
        return update  # the stream is closed by the loop's async-generator finalizer
    raise AssertionError("WatchIndex ended without a snapshot")


def cluster_calls(client: MetadataClient) -> list[Callable[[], Awaitable[object]]]:
    """One call of each cluster-scoped RPC; the report names live node A."""
    report = [MatchPrediction("r1", 64, {A: 64}, A, 80)]
    return [lambda: client.match([MatchQuery(L, tuple(H), request_id="r1")]), client.stats,
            lambda: first_update(client), lambda: client.report_predictions(report, "router-1")]


def run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(body())  # type: ignore[arg-type]


def test_a_node_credential_is_refused_on_every_cluster_scoped_rpc() -> None:
    async def body() -> None:
        async with secured() as c:
            node = c.client(CallerCredentials.node(SECRET, A))
            seq = c.service.feed.seq
            for call in cluster_calls(node):
                assert await code_of(call()) == grpc.StatusCode.PERMISSION_DENIED
            assert c.service.feed.seq == seq  # no routed work reached the routers' load tables
            assert c.service.feed.watchers == 0  # no watch stream was opened
            await node.heartbeat(A, c.epoch, NodeLoad(), [RequestHits("r1", "t", TokenSources(computed=80))])
            assert c.service.hits.stats().total.cluster_cached_tokens == 0  # no prediction was kept

    run(body)


def test_the_cluster_credential_calls_every_cluster_scoped_rpc() -> None:
    async def body() -> None:
        async with secured() as c:
            router = c.client(CallerCredentials.cluster(SECRET))
            [match] = await router.match([MatchQuery(L, tuple(H))])
            assert [(n.node_id, n.any_tier_blocks) for n in match.nodes] == [(A, 4)]
            assert (await router.stats()).live_nodes == 1
            update = await first_update(router)
            assert update.reset and [n.node_id for n in update.nodes] == [A]

    run(body)


@pytest.mark.parametrize("token", ["metrics", "node token as the cluster's"])
def test_another_purposes_token_does_not_open_the_metadata_service(token: str) -> None:
    value = {"metrics": metrics_token(SECRET),
             "node token as the cluster's": dict(CallerCredentials.node(SECRET, A).metadata)[TOKEN_METADATA_KEY]
             .removeprefix("Bearer ")}[token]

    async def body() -> None:
        async with secured() as c:
            stolen = c.client(CallerCredentials(((TOKEN_METADATA_KEY, f"Bearer {value}"),)))
            for call in cluster_calls(stolen):
                assert await code_of(call()) == grpc.StatusCode.UNAUTHENTICATED
            assert await code_of(stolen.heartbeat(A, c.epoch, NodeLoad())) == grpc.StatusCode.UNAUTHENTICATED

    run(body)


BAD_PREDICTIONS = {
    "routed to an unknown node": pb.Prediction(request_id="r2", routed_node=GONE, routed_tokens=16),
    "routed to a malformed node id": pb.Prediction(request_id="r2", routed_node="no spaces", routed_tokens=16),
    "local tokens of an unknown node": pb.Prediction(request_id="r2", local_tokens={GONE: 16}),
    "routed tokens past a prompt": pb.Prediction(request_id="r2", routed_node=A, routed_tokens=1 << 62),
    "cluster tokens past a prompt": pb.Prediction(request_id="r2", cluster_tokens=MAX_PROMPT_TOKENS + 1),
    "local tokens past a prompt": pb.Prediction(request_id="r2", local_tokens={A: MAX_PROMPT_TOKENS + 1}),
}


@pytest.mark.parametrize("bad", BAD_PREDICTIONS.values(), ids=BAD_PREDICTIONS.keys())
def test_a_report_with_one_bad_prediction_is_refused_whole(bad: pb.Prediction) -> None:
    async def body() -> None:
        async with secured() as c:
            seq = c.service.feed.seq
            good = pb.Prediction(request_id="r1", cluster_tokens=64, local_tokens={A: 64}, routed_node=A,
                                 routed_tokens=80)
            async with grpc.aio.insecure_channel(c.target) as channel:
                report = pb_grpc.MetadataServiceStub(channel).ReportPredictions(
                    pb.PredictionBatch(predictions=[good, bad], router_id="router-1"),
                    metadata=CallerCredentials.cluster(SECRET).metadata)
                assert await code_of(report) == grpc.StatusCode.INVALID_ARGUMENT
            assert c.service.feed.seq == seq  # not even the good prediction's work went out
            node = c.client(CallerCredentials.node(SECRET, A))
            await node.heartbeat(A, c.epoch, NodeLoad(), [RequestHits("r1", "t", TokenSources(computed=80))])
            assert c.service.hits.stats().total.cluster_cached_tokens == 0

    run(body)


def test_a_valid_report_reaches_hit_accounting_and_the_routers() -> None:
    async def body() -> None:
        async with secured() as c:
            seq = c.service.feed.seq
            router = c.client(CallerCredentials.cluster(SECRET))
            await router.report_predictions([MatchPrediction("r1", 64, {A: 64}, A, 80)], "router-1")
            assert c.service.feed.seq == seq + 1
            node = c.client(CallerCredentials.node(SECRET, A))
            await node.heartbeat(A, c.epoch, NodeLoad(), [RequestHits("r1", "t", TokenSources(computed=80))])
            assert c.service.hits.stats().total.cluster_cached_tokens == 64

    run(body)
