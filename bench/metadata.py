"""Metadata service benchmark, one run, both baselines measured here.

(a) In-process: the same op stream (Match, BlockStored, BlockRemoved) replayed on GlobalIndex and on a
    naive dict-of-sets index, from a Mooncake trace over 64 nodes with replicated hot prefixes and
    per-node LRU eviction. Block-ops = block hashes matched + stored + removed.
(b) Over gRPC on loopback (server in a subprocess, 8 concurrent clients, prebuilt protobuf requests so
    the client's cost stays small): batched event ingest, Match saturation QPS, an echo RPC with the
    same request payload (the gRPC floor), and Match latency at half of saturation, open loop.

Both processes (server and this one) run with the server's GC setting, `tune_gc_for_serving`.

Usage: python bench/metadata.py [--trace PATH] [--limit K] [--seconds S] [--out DIR] [--smoke]
Prints the figures, then one JSON object as the last line (also DIR/metadata.json, default bench/results).
"""

import argparse
import asyncio
import json
import logging
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import grpc
from metadata_ops import (
    LAYOUT,
    NODE_CAPACITY,
    NODES,
    TRACE_BLOCK_BYTES,
    TRACE_BLOCK_TOKENS,
    Op,
    bench_index,
    load_trace,
    op_stream,
)

from radixmesh.cluster.metadata.server import (
    ServerOptions,
    create_server,
    serve_until_signalled,
    tune_gc_for_serving,
)
from radixmesh.cluster.metadata.service import MetadataService
from radixmesh.cluster.metadata.service_config import ServiceConfig, ServiceLimits
from radixmesh.proto import radixmesh_pb2 as pb
from radixmesh.proto import radixmesh_pb2_grpc as pb_grpc
from radixmesh.proto.ids import NodeId
from radixmesh.proto.metadata.codec import node_info_to_pb
from radixmesh.proto.metadata.nodes import NodeInfo

logger = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parent.parent
ECHO_METHOD = "/radixmesh.bench.Echo/Match"
SMOKE = {"limit": 200, "seconds": 0.3}

# ---- (b) over gRPC -------------------------------------------------------------------------------


def serve() -> None:
    """Child process: the metadata server plus the echo baseline, on 127.0.0.1, until SIGTERM."""
    limits = ServiceLimits(max_blocks_per_batch=1 << 16)
    service = MetadataService(config=ServiceConfig(lease_ttl_s=3600.0, limits=limits))
    reply = pb.MatchResponse()

    async def echo(request: pb.MatchRequest, context: grpc.aio.ServicerContext) -> pb.MatchResponse:
        return reply

    handler = grpc.method_handlers_generic_handler(
        "radixmesh.bench.Echo",
        {
            "Match": grpc.unary_unary_rpc_method_handler(
                echo, request_deserializer=pb.MatchRequest.FromString, response_serializer=pb.MatchResponse.SerializeToString
            )
        },
    )

    async def run() -> None:
        server, port = create_server(service, ServerOptions(port=0, upkeep_interval_s=None), handler)
        await serve_until_signalled(server, 1.0, lambda: print(f"PORT {port}", flush=True))

    asyncio.run(run())


async def closed_loop(call: Callable[[pb.MatchRequest], object], requests: list[pb.MatchRequest], seconds: float, clients: int) -> float:
    """Requests per second with `clients` callers, each waiting for its answer before the next."""
    done = 0
    deadline = time.perf_counter() + seconds

    async def worker(k: int) -> None:
        nonlocal done
        i = k
        while time.perf_counter() < deadline:
            await call(requests[i % len(requests)])  # type: ignore[misc]
            done += 1
            i += clients

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(k) for k in range(clients)))
    return done / (time.perf_counter() - t0)


async def open_loop(call: Callable[[pb.MatchRequest], object], requests: list[pb.MatchRequest], rate: float, seconds: float) -> list[float]:
    """Latencies (s) of requests sent on a fixed schedule at `rate`, whatever the answers' pace."""
    latencies: list[float] = []

    async def one(req: pb.MatchRequest) -> None:
        t0 = time.perf_counter()
        await call(req)  # type: ignore[misc]
        latencies.append(time.perf_counter() - t0)

    tasks = []
    start = time.perf_counter()
    n = int(rate * seconds)
    for i in range(n):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(requests[i % len(requests)])))
    await asyncio.gather(*tasks)
    return latencies


def event_batches(ops: list[Op], rounds: int) -> dict[NodeId, list[pb.EventBatch]]:
    """Each node's stored/removed events as protobuf batches of about 512 blocks, in order.

    The trace's events repeat `rounds` times, each round but the last ending with the node removing
    everything it still holds, so the stream is long enough to time and ends with the trace's state.
    """
    per_node: dict[NodeId, list[pb.EventBatch]] = {n: [] for n in NODES}
    pending: dict[NodeId, list[pb.CacheEvent]] = {n: [] for n in NODES}
    holding: dict[NodeId, set[bytes]] = {n: set() for n in NODES}
    size: Counter[NodeId] = Counter()

    def flush(n: NodeId) -> None:
        if pending[n]:
            per_node[n].append(pb.EventBatch(node_id=n, epoch=1, seq=len(per_node[n]) + 1, events=pending[n]))
            pending[n], size[n] = [], 0

    def add(n: NodeId, ev: pb.CacheEvent, blocks: int) -> None:
        pending[n].append(ev)
        size[n] += blocks
        if size[n] >= 512:
            flush(n)

    for r in range(rounds):
        for kind, node, hashes, parent in ops:
            if node is None:
                continue
            if kind == "store":
                holding[node].update(hashes)
                add(node, pb.CacheEvent(stored=pb.BlockStored(hashes=hashes, parent=parent or b"", tier=pb.TIER_GPU)), len(hashes))
            else:
                holding[node].difference_update(hashes)
                add(node, pb.CacheEvent(removed=pb.BlockRemoved(hashes=hashes, tier=pb.TIER_GPU)), len(hashes))
        for n in NODES:
            if r < rounds - 1:
                add(n, pb.CacheEvent(removed=pb.BlockRemoved(hashes=sorted(holding[n]), tier=pb.TIER_GPU)), len(holding[n]))
                holding[n].clear()
            flush(n)
    return per_node


async def bench_grpc(ops: list[Op], seconds: float, clients: int = 8) -> dict[str, float]:
    child = subprocess.Popen(  # noqa: ASYNC220 (started once, before any await)
        [sys.executable, __file__, "--serve"], stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.startswith("PORT "), f"server did not start: {line!r}"
        target = f"127.0.0.1:{int(line.split()[1])}"
        channels = [grpc.aio.insecure_channel(target) for _ in range(clients)]
        stubs = [pb_grpc.MetadataServiceStub(c) for c in channels]
        for n in NODES:
            await stubs[0].RegisterNode(node_info_to_pb(NodeInfo(n, 1, LAYOUT, TRACE_BLOCK_TOKENS, TRACE_BLOCK_BYTES,
                                                                  f"addr-{n}", NODE_CAPACITY)))

        batches = event_batches(ops, rounds=3)
        blocks = sum(len(e.stored.hashes) + len(e.removed.hashes) for bs in batches.values() for b in bs for e in b.events)

        async def ingest(k: int) -> None:
            for n in NODES[k::clients]:
                ack = await stubs[k].PublishEvents(iter(batches[n]))
                assert ack.status == pb.PublishAck.OK and ack.next_seq == len(batches[n]) + 1, ack

        t0 = time.perf_counter()
        await asyncio.gather(*(ingest(k) for k in range(clients)))
        events_rate = blocks / (time.perf_counter() - t0)

        queries = [
            pb.MatchRequest(queries=[pb.MatchQuery(layout_fingerprint=LAYOUT, hashes=h)])
            for kind, _, h, _ in ops
            if kind == "match"
        ][:2000]
        echo_calls = [c.unary_unary(ECHO_METHOD, pb.MatchRequest.SerializeToString, pb.MatchResponse.FromString) for c in channels]
        rr = {"m": 0, "e": 0}

        def match_call(req: pb.MatchRequest) -> object:
            rr["m"] += 1
            return stubs[rr["m"] % clients].Match(req)

        def echo_call(req: pb.MatchRequest) -> object:
            rr["e"] += 1
            return echo_calls[rr["e"] % clients](req)

        await closed_loop(match_call, queries, 0.5, clients)  # warm-up
        windows = 6  # alternate short windows so drifting machine load hits both sides alike
        match_qps = echo_qps = 0.0
        for _ in range(windows):
            match_qps += await closed_loop(match_call, queries, seconds / windows, clients) / windows
            echo_qps += await closed_loop(echo_call, queries, seconds / windows, clients) / windows
        lat = sorted(await open_loop(match_call, queries, match_qps / 2, seconds))
        for c in channels:
            await c.close()
        return {
            "events_blocks_per_s": events_rate,
            "match_qps": match_qps,
            "echo_qps": echo_qps,
            "ratio_match_vs_echo": match_qps / echo_qps,
            "match_p50_ms": 1000 * lat[len(lat) // 2],
            "match_p99_ms": 1000 * lat[min(len(lat) - 1, int(len(lat) * 0.99))],
            "half_saturation_qps": match_qps / 2,
        }
    finally:
        child.terminate()
        child.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=ROOT / "tests" / "data" / "traces" / "synthetic_trace.jsonl")
    parser.add_argument("--limit", type=int, default=None, help="first K requests of the trace")
    parser.add_argument("--seconds", type=float, default=3.0, help="per gRPC measurement")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results", help="folder for metadata.json")
    parser.add_argument("--smoke", action="store_true", help=f"tiny run: {SMOKE}")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve()
        return
    if args.smoke:  # smaller defaults; sizes given on the command line still win
        parser.set_defaults(**SMOKE)
        args = parser.parse_args()
    ops = op_stream(load_trace(args.trace)[: args.limit])
    # The server process tunes its GC in serve_until_signalled. This process runs the index
    # in-process (a) and generates the gRPC load (b), so it takes the same setting through the
    # same function: (a) then runs as the index runs in the server, and (b)'s latencies are not
    # the load generator's own full collections of the op stream it holds.
    tune_gc_for_serving()
    # Both sides of each ratio run in this process, back to back; the load average says how
    # contended the machine was for the absolute figures.
    result: dict[str, object] = {
        "bench": "metadata",
        "trace": args.trace.name,
        "nodes": len(NODES),
        "load_avg_1m": os.getloadavg()[0],
    }
    result.update(bench_index(ops))
    print(
        f"index: {result['index_block_ops_per_s']:.3g} block-ops/s, naive dict-of-sets "
        f"{result['naive_block_ops_per_s']:.3g}, ratio {result['ratio_index_vs_naive']:.2f}"
    )
    result.update(asyncio.run(bench_grpc(ops, args.seconds)))
    print(
        f"grpc: events {result['events_blocks_per_s']:.3g} blocks/s, match {result['match_qps']:.0f} qps, "
        f"echo {result['echo_qps']:.0f} qps, ratio {result['ratio_match_vs_echo']:.2f}, at half saturation "
        f"p50 {result['match_p50_ms']:.2f} ms p99 {result['match_p99_ms']:.2f} ms"
    )
    if args.smoke:
        result["smoke"] = True
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "metadata.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
