"""Route decisions on the router's index replica vs the Match RPC vs a bare dict lookup, and replica
lag (bench/scale.py runs these; kept apart so the node-count sweep stays readable).

Everything runs in this one process on one event loop: the metadata service behind real grpc.aio on
127.0.0.1, the router(s) and the publisher. So the Match-RPC figure includes the server's share of
the same two cores, as a router next to its metadata service would see it, and replica lag is the
service applying a batch plus one stream hop, with nothing else running. Decisions are timed twice:
wall time (what a request waits, including other processes on a shared machine and GC pauses) and
this thread's CPU time (the decision's own cost; the Match path's CPU excludes the server's work
done while this thread waits, so it understates that path).
"""

import asyncio
import gc
import random
import statistics
import time
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from itertools import takewhile
from typing import Any

from radixmesh.cluster.fleet.agent_client import AgentClient
from radixmesh.cluster.metadata.server import ServerOptions, create_server
from radixmesh.cluster.metadata.service import MetadataService
from radixmesh.cluster.metadata.service_config import ServiceConfig
from radixmesh.cluster.router.config import RouterConfig
from radixmesh.cluster.router.index_watch import IndexWatcher
from radixmesh.cluster.router.router import Router
from radixmesh.cluster.sim.trace import TokenMapping, TraceRequest
from radixmesh.common.metadata.client import MetadataClient
from radixmesh.proto.block_hash import BlockHash, hash_blocks
from radixmesh.proto.events import BlockStored, Tier
from radixmesh.proto.ids import NodeId
from radixmesh.proto.metadata.messages import EventBatch, IndexUpdate
from radixmesh.proto.metadata.nodes import NodeInfo
from radixmesh.proto.serve.plan import ServeItem, ServePlan
from radixmesh.proto.serve.sampling import SamplingParams

LAYOUT = "bench-route"
BLOCK = 16
MAX_BLOCKS = 128  # as the trace replay maps prompts (ReplayConfig.max_prompt_blocks)


@dataclass(frozen=True, slots=True)
class NullAgent:
    """A directory entry that is never served: only routing decisions are timed."""

    node: NodeId

    async def serve(self, plan: ServePlan) -> AsyncGenerator[ServeItem, None]:
        raise AssertionError("the benchmark never serves")
        yield  # pragma: no cover

    async def prometheus_text(self) -> str:
        return ""

    async def scrape_target(self) -> None:
        return None


class Directory:
    def __init__(self, nodes: Sequence[NodeId]) -> None:
        self._clients: dict[NodeId, AgentClient] = {n: NullAgent(n) for n in nodes}

    def get(self, node: NodeId) -> AgentClient | None:
        return self._clients.get(node)

    def nodes(self) -> list[NodeId]:
        return sorted(self._clients)

    def role(self, node: NodeId) -> str:
        return "both"


class PrehashedRouter(Router):
    """The production Router with the prompt's block hashes computed before the clock starts, so the
    three paths time the same thing: the decision, not BLAKE2b."""

    prehashed: dict[str, list[BlockHash]]

    def block_hashes(self, request: ServePlan) -> list[BlockHash]:
        return self.prehashed[request.request_id]

    async def decide(self, request: ServePlan) -> NodeId:
        routed = await self.plan(request)
        # What serving would record (recent work drives the least-loaded candidates); nothing is served,
        # so no first token will end the request's pending hold: drop it, as a failed attempt would.
        d = routed.decision
        self._inflight.record_routed(d.node, len(request.prompt_token_ids) - (d.local_blocks + d.pull_blocks) * BLOCK)
        if routed.hold is not None:
            self._step.abandon(routed.hold)
        return routed.decision.node


def prompt_hashes(requests: Sequence[TraceRequest]) -> list[list[BlockHash]]:
    mapping = TokenMapping(tokens_per_block=BLOCK)
    return [hash_blocks(mapping.tokens(TraceRequest(r.arrival_s, r.input_length, r.output_length,
                                                    r.hash_ids[:MAX_BLOCKS])), BLOCK)
            for r in requests]


def populate(service: MetadataService, nodes: Sequence[NodeId], prompts: Sequence[list[BlockHash]]) -> int:
    """Each prompt's chain stored on the node its first block maps to, and on one more for a quarter
    of them (hot prefixes replicated): an index shaped by prefix-affinity routing. Returns blocks."""
    seqs = dict.fromkeys(nodes, 0)
    for n in nodes:
        service.register(NodeInfo(n, 1, LAYOUT, BLOCK, 4096, f"tcp://{n}", 100_000))
    blocks = 0
    for i, hashes in enumerate(prompts):
        owner = int.from_bytes(hashes[0][:4], "little")
        holders = {nodes[owner % len(nodes)]}
        if i % 4 == 0:
            holders.add(nodes[(owner // 7) % len(nodes)])
        for n in holders:
            seqs[n] += 1
            service.publish(EventBatch(n, 1, seqs[n], (BlockStored(tuple(hashes), None, Tier.GPU),)))
            blocks += len(hashes)
    return blocks


def pct(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def summary(times_s: Sequence[float]) -> dict[str, float]:
    ms = [t * 1e3 for t in times_s]
    return {"p50_ms": pct(ms, 0.5), "p99_ms": pct(ms, 0.99), "mean_ms": statistics.fmean(ms)}


async def poll(cond: object, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError("the replica did not catch up")
        await asyncio.sleep(0.01)


async def bench_routes(n_nodes: int, requests: Sequence[TraceRequest], warm: int, routed: int) -> dict[str, Any]:
    """Decision latency of the same `routed` requests on each path, after `warm` requests built the index."""
    nodes = [NodeId(f"node-{i:03d}") for i in range(n_nodes)]
    prompts = prompt_hashes(requests[: warm + routed])
    service = MetadataService(config=ServiceConfig(lease_ttl_s=3600.0))
    blocks = populate(service, nodes, prompts[:warm])
    server, port = create_server(service, ServerOptions(upkeep_interval_s=None, max_message_bytes=256 << 20))
    await server.start()
    client = MetadataClient(f"127.0.0.1:{port}", max_message_bytes=256 << 20)
    out: dict[str, Any] = {"nodes": n_nodes, "indexed_blocks": blocks, "decisions": routed}
    try:
        for name, replica in (("replica", True), ("match_rpc", False)):
            config = RouterConfig(LAYOUT, block_size=BLOCK, index_replica=replica, match_timeout_s=10.0)
            router = PrehashedRouter(config, Directory(nodes), client, rng=random.Random(0))
            reqs = []
            router.prehashed = {}
            for i, hashes in enumerate(prompts[warm:]):
                rid = f"{name}-{i}"
                router.prehashed[rid] = hashes
                reqs.append(ServePlan(rid, (0,) * (len(hashes) * BLOCK), SamplingParams(max_tokens=1)))
            if replica:
                router.start()
                assert router.watcher is not None
                watcher = router.watcher
                await poll(lambda w=watcher: w.replica.seq == service.feed.seq)
            gc.collect()
            times, cpu = [], []
            for r in reqs:
                c0, t0 = time.thread_time(), time.perf_counter()
                await router.decide(r)
                times.append(time.perf_counter() - t0)
                cpu.append(time.thread_time() - c0)
            if replica:
                assert router.replica_decisions == len(reqs), "a decision fell back to Match"
            out[name] = summary(times) | {f"cpu_{k}": v for k, v in summary(cpu).items()}
            await router.close()
        # The floor: the prompt's hashes looked up in one dict, as the index's first step does.
        table = {h: nodes[0] for hashes in prompts[:warm] for h in hashes}
        times, cpu = [], []
        for hashes in prompts[warm:]:
            c0, t0 = time.thread_time(), time.perf_counter()
            list(takewhile(bool, map(table.get, hashes)))
            times.append(time.perf_counter() - t0)
            cpu.append(time.thread_time() - c0)
        out["dict_lookup"] = summary(times) | {f"cpu_{k}": v for k, v in summary(cpu).items()}
    finally:
        await client.close()
        await server.stop(0)
    return out


async def bench_lag(requests: Sequence[TraceRequest], speedup: float, events: int) -> dict[str, float]:
    """BlockStored published by an agent (one batch per trace request, at the trace's pace / speedup)
    until the router's replica has applied it."""
    prompts = prompt_hashes(requests[:events])
    service = MetadataService(config=ServiceConfig(lease_ttl_s=3600.0))
    node = NodeId("agent-0")
    server, port = create_server(service, ServerOptions(upkeep_interval_s=None))
    await server.start()
    agent = MetadataClient(f"127.0.0.1:{port}")
    router_client = MetadataClient(f"127.0.0.1:{port}")
    sent: dict[BlockHash, float] = {}
    lags: list[float] = []

    def seen(update: IndexUpdate) -> None:
        now = time.perf_counter()
        for b in update.blocks:
            for e in b.events:
                t0 = sent.pop(e.hashes[0], None) if isinstance(e, BlockStored) and e.hashes else None
                if t0 is not None:
                    lags.append(now - t0)

    watcher = IndexWatcher(router_client, on_update=seen)
    try:
        await agent.register(NodeInfo(node, 1, LAYOUT, BLOCK, 4096, "tcp://agent-0", 100_000))
        watcher.start()
        await poll(lambda: watcher.replica.in_sync)
        start = time.perf_counter()
        base = requests[0].arrival_s
        for seq, (r, hashes) in enumerate(zip(requests[:events], prompts, strict=True), 1):
            due = start + (r.arrival_s - base) / speedup
            await asyncio.sleep(max(0.0, due - time.perf_counter()))  # pacing the load, not synchronising
            sent[hashes[0]] = time.perf_counter()
            await agent.publish([EventBatch(node, 1, seq, (BlockStored(tuple(hashes), None, Tier.GPU),))])
        await poll(lambda: not sent)
        elapsed = time.perf_counter() - start
    finally:
        await watcher.close()
        await agent.close()
        await router_client.close()
        await server.stop(0)
    ms = summary(lags)
    return {"lag_p50_ms": ms["p50_ms"], "lag_p99_ms": ms["p99_ms"], "events": float(len(lags)),
            "events_per_s": len(lags) / elapsed, "speedup": speedup}
