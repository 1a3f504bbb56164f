"""The metadata service over real gRPC on 127.0.0.1, port 0: membership, events, match, limits, token."""

import asyncio
import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from radixmesh.cluster.metadata.server import TlsFiles
from radixmesh.cluster.metadata.service import MetadataService
from radixmesh.cluster.metadata.service_config import ServiceConfig, ServiceLimits
from radixmesh.cluster.metadata.store import MemoryStore
from radixmesh.common.metadata.auth import NO_CREDENTIALS, CallerCredentials
from radixmesh.common.metadata.client import MetadataClient
from radixmesh.common.secret import ClusterSecret
from radixmesh.proto import radixmesh_pb2 as pb
from radixmesh.proto import radixmesh_pb2_grpc as pb_grpc
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.events import AllCleared, BlockRemoved, BlockStored, Tier
from radixmesh.proto.ids import NodeId
from radixmesh.proto.kv_layout import KVLayout
from radixmesh.proto.metadata.hits import RequestHits
from radixmesh.proto.metadata.messages import EventBatch, MatchQuery, NodeSnapshot, PublishStatus
from radixmesh.proto.metadata.nodes import NodeInfo, NodeLoad
from radixmesh.proto.serve.tokens import TokenSources
from tests.support.servers import start_metadata_server

pytestmark = pytest.mark.integration

L = "layout-0123456789"
H = [BlockHash(bytes([i]) * 16) for i in range(1, 33)]
A, B = NodeId("node-a"), NodeId("node-b")
TTL = 10.0
BB = 4096


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def info(node: NodeId, epoch: int = 1, layout: str = L, block_bytes: int = BB) -> NodeInfo:
    return NodeInfo(node, epoch, layout, 16, block_bytes, f"ucx://{node}", 1000)


def stored(hashes: list[BlockHash], parent: BlockHash | None = None, tier: Tier = Tier.GPU) -> BlockStored:
    return BlockStored(tuple(hashes), parent, tier)


def run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(body())  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def serving(service: MetadataService, credentials: CallerCredentials = NO_CREDENTIALS,
                  **opts: object) -> AsyncIterator[tuple[MetadataClient, int]]:
    server, port = await start_metadata_server(service, **opts)
    client = MetadataClient(f"127.0.0.1:{port}", credentials=credentials)
    try:
        yield client, port
    finally:
        await client.close()
        await server.stop(None)


def new_service(clock: Clock | None = None, limits: ServiceLimits | None = None) -> MetadataService:
    config = ServiceConfig(lease_ttl_s=TTL, limits=limits or ServiceLimits())
    return MetadataService(config=config, clock=clock or Clock())


def test_register_publish_match() -> None:
    async def body() -> None:
        service = new_service()
        async with serving(service) as (client, _):
            lease = await client.register(info(A))
            assert (lease.epoch, lease.next_seq, lease.ttl_s) == (1, 1, TTL)
            await client.register(info(B))
            load = NodeLoad(queued_requests=3, running_tokens=512, free_blocks=77, pull_gbps={"node-b": 2.5})
            await client.heartbeat(A, 1, load)
            ack = await client.publish(
                [
                    EventBatch(A, 1, 1, (stored(H[:4]),)),
                    EventBatch(A, 1, 2, (stored(H[4:6], H[3], Tier.HOST), BlockRemoved((H[2],), Tier.GPU))),
                ]
            )
            assert (ack.status, ack.next_seq) == (PublishStatus.OK, 3)
            await client.publish([EventBatch(B, 1, 1, (stored(H[:3], None, Tier.HOST),))])
            [res, empty] = await client.match([MatchQuery(L, tuple(H[:8])), MatchQuery(L, (H[20],))])
            assert res.cluster_blocks == 6
            by_node = {n.node_id: n for n in res.nodes}
            a = by_node[A]
            assert (a.gpu_blocks, a.host_blocks, a.any_tier_blocks) == (2, 2, 2)  # host: on gpu or host
            assert (a.transfer_address, a.load) == ("ucx://node-a", load)
            assert (by_node[B].gpu_blocks, by_node[B].host_blocks) == (0, 3)
            assert [n.node_id for n in res.nodes] == [B, A]  # longest prefix first
            assert empty.cluster_blocks == 0 and empty.nodes == ()
            [all_nodes] = await client.match([MatchQuery(L, (H[20],), include_all_nodes=True)])
            assert sorted(n.node_id for n in all_nodes.nodes) == [A, B]
            service.check_invariants()

    run(body)


def test_lease_expiry_drops_node_from_match() -> None:
    async def body() -> None:
        clock = Clock()
        service = new_service(clock)
        async with serving(service) as (client, _):
            for n in (A, B):
                await client.register(info(n))
                await client.publish([EventBatch(n, 1, 1, (stored(H[:3]),))])
            clock.now += TTL - 1
            await client.heartbeat(A, 1, NodeLoad())
            clock.now += 1  # B's lease ends exactly now; A's was renewed
            [res] = await client.match([MatchQuery(L, tuple(H[:3]))])
            assert [n.node_id for n in res.nodes] == [A]
            assert (await client.stats()).live_nodes == 1
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await client.heartbeat(B, 1, NodeLoad())
            assert err.value.code() == grpc.StatusCode.NOT_FOUND
            lease = await client.register(info(B))
            assert lease.snapshot_required
            service.check_invariants()

    run(body)


def test_stale_epoch_refused_and_new_epoch_starts_empty() -> None:
    async def body() -> None:
        service = new_service()
        async with serving(service) as (client, _):
            await client.register(info(A, epoch=1))
            await client.publish([EventBatch(A, 1, 1, (stored(H[:3]),))])
            lease = await client.register(info(A, epoch=2))
            assert lease.next_seq == 1 and lease.snapshot_required
            [res] = await client.match([MatchQuery(L, tuple(H[:3]))])
            assert res.nodes == ()  # the old incarnation's blocks are gone
            for call in (
                client.publish([EventBatch(A, 1, 2, (stored(H[3:4], H[2]),))]),
                client.heartbeat(A, 1, NodeLoad()),
                client.register(info(A, epoch=1)),
            ):
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await call
                assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert len(service.index) == 0

    run(body)


def test_sequence_gap_resync_snapshot() -> None:
    async def body() -> None:
        service = new_service()
        async with serving(service) as (client, _):
            await client.register(info(A))
            await client.publish([EventBatch(A, 1, 1, (stored(H[:2]),))])
            ack = await client.publish(
                [EventBatch(A, 1, 3, (stored(H[5:6]),)), EventBatch(A, 1, 4, (stored(H[6:7]),))]
            )
            assert (ack.status, ack.next_seq) == (PublishStatus.RESYNC, 2)
            assert len(service.index) == 2  # nothing after the gap was applied
            snap = NodeSnapshot(A, 1, 4, (stored(H[:3]), stored(H[10:12], None, Tier.HOST)))
            ack = await client.sync_snapshot(snap)
            assert (ack.status, ack.next_seq) == (PublishStatus.OK, 5)
            dup = await client.publish([EventBatch(A, 1, 4, (AllCleared(),)), EventBatch(A, 1, 5, ())])
            assert (dup.status, dup.next_seq) == (PublishStatus.OK, 6)  # seq 4 was a duplicate
            [res, host] = await client.match([MatchQuery(L, tuple(H[:3])), MatchQuery(L, tuple(H[10:12]))])
            assert (res.nodes[0].gpu_blocks, host.nodes[0].host_blocks) == (3, 2)
            service.check_invariants()

    run(body)


def test_hit_accounting_joins_prediction_and_report() -> None:
    async def body() -> None:
        service = new_service()
        async with serving(service) as (client, _):
            for n in (A, B):
                await client.register(info(n))
            await client.publish([EventBatch(A, 1, 1, (stored(H[:2]),))])
            await client.publish([EventBatch(B, 1, 1, (stored(H[:4]),))])
            await client.match([MatchQuery(L, tuple(H[:6]), tenant="acme", request_id="r1")])
            # Served on A (predicted 2 local blocks = 32 tokens, 4 in the cluster = 64 tokens):
            # 16 local gpu tokens, 16 pulled, 64 computed -> 32 of the 64 cached tokens recomputed.
            hits = RequestHits("r1", "acme", TokenSources(16, 0, 16, 64))
            await client.heartbeat(A, 1, NodeLoad(), [hits, RequestHits("", "other", TokenSources(computed=10))])
            stats = await client.stats()
            t = stats.hits.per_tenant["acme"]
            assert (t.requests, t.prompt_tokens, t.miss_tokens) == (1, 96, 64)
            assert (t.cluster_cached_tokens, t.regret_tokens) == (64, 32)
            assert (t.predicted_local_tokens, t.realized_local_tokens) == (32, 16)
            assert t.hit_rate == pytest.approx(32 / 96) and t.index_precision == pytest.approx(0.5)
            assert stats.hits.total.requests == 2 and stats.hits.total.prompt_tokens == 106
            assert stats.hits.per_node[A].requests == 2 and B not in stats.hits.per_node
            assert (stats.live_nodes, stats.indexed_blocks, stats.state_store) == (2, 4, "memory")

    run(body)


def test_block_bytes_of_each_layout_kept_through_register_and_restart() -> None:
    f32 = KVLayout("m", num_layers=2, num_kv_heads=2, head_dim=8, dtype="float32", block_size=16)
    bf16 = dataclasses.replace(f32, dtype="bfloat16")
    declared = {A: info(A, layout=f32.fingerprint(), block_bytes=f32.block_bytes),
                B: info(B, layout=bf16.fingerprint(), block_bytes=bf16.block_bytes)}

    async def body() -> None:
        clock, store = Clock(), MemoryStore()
        service = MetadataService(store, ServiceConfig(lease_ttl_s=TTL), clock)
        async with serving(service) as (client, _):
            for node_info in declared.values():
                await client.register(node_info)
        kept = {m.info.node_id: m.info for m in service.membership.members()}
        assert kept == declared and kept[B].block_bytes * 2 == kept[A].block_bytes
        restarted = MetadataService(store, ServiceConfig(lease_ttl_s=TTL), clock)
        assert {m.info.node_id: m.info for m in restarted.membership.members()} == declared

    run(body)


def _raw_batch(**event: object) -> pb.EventBatch:
    return pb.EventBatch(node_id=A, epoch=1, seq=2, events=[pb.CacheEvent(**event)])  # type: ignore[arg-type]


GOOD_HASH = H[30]
BAD_INPUTS: list[tuple[str, str, object, grpc.StatusCode]] = [
    ("short hash in match", "Match", pb.MatchRequest(queries=[pb.MatchQuery(layout_fingerprint=L, hashes=[b"x" * 15])]), grpc.StatusCode.INVALID_ARGUMENT),
    ("empty layout", "Match", pb.MatchRequest(queries=[pb.MatchQuery(hashes=[H[0]])]), grpc.StatusCode.INVALID_ARGUMENT),
    ("too many hashes", "Match", pb.MatchRequest(queries=[pb.MatchQuery(layout_fingerprint=L, hashes=[H[0]] * 65)]), grpc.StatusCode.RESOURCE_EXHAUSTED),
    ("too many queries", "Match", pb.MatchRequest(queries=[pb.MatchQuery(layout_fingerprint=L, hashes=[H[0]])] * 9), grpc.StatusCode.RESOURCE_EXHAUSTED),
    ("message too large", "Match", pb.MatchRequest(queries=[pb.MatchQuery(layout_fingerprint="x" * 70000)]), grpc.StatusCode.RESOURCE_EXHAUSTED),
    ("unspecified tier", "PublishEvents", _raw_batch(stored=pb.BlockStored(hashes=[GOOD_HASH])), grpc.StatusCode.INVALID_ARGUMENT),
    ("empty event", "PublishEvents", _raw_batch(), grpc.StatusCode.INVALID_ARGUMENT),
    ("bad hash in batch", "PublishEvents", _raw_batch(removed=pb.BlockRemoved(hashes=[b"abc"], tier=pb.TIER_GPU)), grpc.StatusCode.INVALID_ARGUMENT),
    ("bad parent", "PublishEvents", _raw_batch(stored=pb.BlockStored(hashes=[GOOD_HASH], parent=b"p", tier=pb.TIER_GPU)), grpc.StatusCode.INVALID_ARGUMENT),
    ("conflicting parent", "PublishEvents", _raw_batch(stored=pb.BlockStored(hashes=[H[1]], parent=H[5], tier=pb.TIER_GPU)), grpc.StatusCode.INVALID_ARGUMENT),
    ("batch too large", "PublishEvents", _raw_batch(stored=pb.BlockStored(hashes=H[10:20], tier=pb.TIER_GPU)), grpc.StatusCode.RESOURCE_EXHAUSTED),
    ("seq zero", "PublishEvents", pb.EventBatch(node_id=A, epoch=1, seq=0), grpc.StatusCode.INVALID_ARGUMENT),
    ("unknown node", "PublishEvents", pb.EventBatch(node_id="ghost", epoch=1, seq=1), grpc.StatusCode.NOT_FOUND),
    ("snapshot bad hash", "SyncSnapshot", pb.NodeSnapshot(node_id=A, epoch=1, seq=9, chains=[pb.BlockStored(hashes=[b"s"], tier=pb.TIER_GPU)]), grpc.StatusCode.INVALID_ARGUMENT),
    ("empty node id", "RegisterNode", pb.RegisterNodeRequest(epoch=1, layout_fingerprint=L, block_size=16, block_bytes=BB), grpc.StatusCode.INVALID_ARGUMENT),
    ("epoch zero", "RegisterNode", pb.RegisterNodeRequest(node_id="c", layout_fingerprint=L, block_size=16, block_bytes=BB), grpc.StatusCode.INVALID_ARGUMENT),
    ("changed layout same epoch", "RegisterNode", pb.RegisterNodeRequest(node_id=A, epoch=1, layout_fingerprint="other", block_size=16, block_bytes=BB), grpc.StatusCode.INVALID_ARGUMENT),
    ("zero block bytes", "RegisterNode", pb.RegisterNodeRequest(node_id="c", epoch=1, layout_fingerprint=L, block_size=16, block_bytes=0), grpc.StatusCode.INVALID_ARGUMENT),
    ("block bytes unlike the layout's", "RegisterNode", pb.RegisterNodeRequest(node_id="c", epoch=1, layout_fingerprint=L, block_size=16, block_bytes=BB // 2), grpc.StatusCode.INVALID_ARGUMENT),
    ("changed block bytes same epoch", "RegisterNode", pb.RegisterNodeRequest(node_id=A, epoch=1, layout_fingerprint=L, block_size=16, block_bytes=2 * BB, transfer_address=f"ucx://{A}", capacity_blocks=1000), grpc.StatusCode.INVALID_ARGUMENT),
    ("hits above prompt", "Heartbeat", pb.HeartbeatRequest(node_id=A, epoch=1, hits=[pb.RequestHits(prompt_tokens=5, remote_tokens=6)]), grpc.StatusCode.INVALID_ARGUMENT),
    ("too many hits", "Heartbeat", pb.HeartbeatRequest(node_id=A, epoch=1, hits=[pb.RequestHits()] * 5), grpc.StatusCode.RESOURCE_EXHAUSTED),
]


@pytest.mark.parametrize(("method", "request_msg", "code"), [b[1:] for b in BAD_INPUTS], ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_refused_and_changes_nothing(method: str, request_msg: object, code: grpc.StatusCode) -> None:
    limits = ServiceLimits(max_hashes_per_query=64, max_queries_per_request=8, max_blocks_per_batch=8, max_hits_per_heartbeat=4)

    async def body() -> None:
        service = new_service(limits=limits)
        async with serving(service, max_message_bytes=65536) as (client, port):
            await client.register(info(A))
            await client.publish([EventBatch(A, 1, 1, (stored(H[:4]),))])
            before = (await client.match([MatchQuery(L, tuple(H[:6]))]), await client.stats())
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = pb_grpc.MetadataServiceStub(channel)
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    if method == "PublishEvents":
                        await stub.PublishEvents(iter([request_msg]))
                    else:
                        await getattr(stub, method)(request_msg)
            assert err.value.code() == code, err.value.details()
            after = (await client.match([MatchQuery(L, tuple(H[:6]))]), await client.stats())
            assert after == before
            assert [m.info for m in service.membership.members()] == [info(A)]  # nothing registered
            lease = await client.heartbeat(A, 1, NodeLoad())
            assert lease.next_seq == 2  # a refused batch does not use up a sequence number
            service.check_invariants()

    run(body)


def test_credential_required_for_every_rpc_but_health() -> None:
    async def body() -> None:
        service = new_service()
        secret = ClusterSecret.generate()
        async with serving(service, CallerCredentials.node(secret, A), secret=secret) as (client, port):
            await client.register(info(A))  # the node's own credential works
            for creds in (NO_CREDENTIALS, CallerCredentials.cluster(ClusterSecret.generate())):
                intruder = MetadataClient(f"127.0.0.1:{port}", credentials=creds)
                calls = [
                    intruder.register(info(B)),
                    intruder.heartbeat(A, 1, NodeLoad()),
                    intruder.publish([EventBatch(A, 1, 1, (stored(H[:2]),))]),
                    intruder.sync_snapshot(NodeSnapshot(A, 1, 1, ())),
                    intruder.match([MatchQuery(L, (H[0],))]),
                    intruder.stats(),
                ]
                for call in calls:
                    with pytest.raises(grpc.aio.AioRpcError) as err:
                        await call
                    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
                await intruder.close()
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                reply = await health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(service="radixmesh.v1.MetadataService")
                )
                assert reply.status == health_pb2.HealthCheckResponse.SERVING
            assert service.index.nodes() == [A] and len(service.index) == 0

    run(body)


def test_tls(tmp_path: Path) -> None:
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )

    async def body() -> None:
        tls = TlsFiles(cert.read_bytes(), key.read_bytes())
        server, port = await start_metadata_server(new_service(), tls=tls)
        try:
            async with MetadataClient(f"127.0.0.1:{port}", root_certificates=cert.read_bytes()) as client:
                assert (await client.register(info(A))).epoch == 1
            async with MetadataClient(f"127.0.0.1:{port}", timeout_s=2) as plain:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await plain.stats()
                assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        finally:
            await server.stop(None)

    run(body)


def test_cli_serves_health_and_stops_gracefully() -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "radixmesh.cluster.cli", "metadata-server", "--host", "127.0.0.1", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the CLI's readiness line, not a sleep
        assert line.startswith("metadata-server listening on 127.0.0.1:"), line + proc.stderr.read()  # type: ignore[union-attr]
        port = int(line.split("127.0.0.1:")[1].split()[0])

        async def check() -> None:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
                assert reply.status == health_pb2.HealthCheckResponse.SERVING

        asyncio.run(check())
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_cli_bad_state_is_one_line_error() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "radixmesh.cluster.cli", "metadata-server", "--port", "0", "--state", "mongodb://x"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode != 0
    assert "state must be 'memory' or a redis:// URL" in proc.stderr


def test_serving_gc_freezes_start_up_objects_and_keeps_collecting() -> None:
    # Process-wide and irreversible, so it runs in a process of its own.
    code = (
        "import gc\n"
        "from radixmesh.cluster.metadata.server import tune_gc_for_serving\n"
        "thresholds = gc.get_threshold()\n"
        "tune_gc_for_serving()\n"
        "assert gc.get_freeze_count() > 10000, gc.get_freeze_count()\n"
        "assert gc.isenabled() and gc.get_threshold() == thresholds, gc.get_threshold()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
