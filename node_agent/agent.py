"""NodeAgent: one node of the cluster, a plain async class (the Ray actor wraps it, see actor.py).

It owns the engine (on its own thread, see engine/runner.py), the gpu tier's transfer server and client,
and optionally an event publisher to the metadata service. `serve` executes a ServePlan:

    prompt blocks  [0, local) | [local, end)          | [end, n)      | last token
                   local hit  | pulled from plan.peer | computed      | always computed
                              (recomputed on failure)

`local` is what this node still holds when the request is queued (it may differ from the router's
view); the request waits in the engine's queue while [local, end) streams in (see `serve`, plan_pull.py).
"""

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from typing import Any

from radixmesh.common.block_pool.config import PoolHooks
from radixmesh.common.block_pool.recall import RecallWindow
from radixmesh.common.metadata.auth import CallerCredentials
from radixmesh.common.metadata.client import MetadataClient
from radixmesh.common.metadata.publisher import EventPublisher, PendingHits, PublisherConfig, PublisherStats
from radixmesh.common.metrics.exposition import render_prometheus
from radixmesh.common.metrics.scrape import MetricsServer, ScrapeTarget
from radixmesh.node_agent.compute_group import compute_group, compute_share
from radixmesh.node_agent.config import AgentConfig
from radixmesh.node_agent.engine.engine import Engine
from radixmesh.node_agent.engine.request import Request, RequestId
from radixmesh.node_agent.engine.runner import EngineRunner, Finished, NewTokens
from radixmesh.node_agent.kv_events.publisher import KVEventsOut, NoKVEvents, ZmqKVEventPublisher
from radixmesh.node_agent.kv_events.token_book import TokenBook
from radixmesh.node_agent.memory.node_memory import NodeMemory
from radixmesh.node_agent.metrics import AgentCounters, render_agent_metrics
from radixmesh.node_agent.node_setup import build_engine, transfer_config
from radixmesh.node_agent.plan_pull import check_pull, pending_prefix, pull_prefix, unpulled
from radixmesh.node_agent.transfer.plane import NoTransfer, Pulled, TransferPlane, make_transfer_plane
from radixmesh.proto.block_hash import BlockHash, tenant_salt
from radixmesh.proto.events import BlockStored, CacheEvent
from radixmesh.proto.ids import NodeId
from radixmesh.proto.kv_layout import KVLayout
from radixmesh.proto.metadata.hits import RequestHits
from radixmesh.proto.metadata.limits import MAX_HITS_PER_HEARTBEAT
from radixmesh.proto.metadata.nodes import NodeInfo, NodeLoad
from radixmesh.proto.serve.limits import AgentBusy, InvalidRequest
from radixmesh.proto.serve.plan import Queued, ServeItem, ServePlan, ServeResult, ServeStats, TokenDelta

logger = logging.getLogger(__name__)


FIRST_ROUND_S = 5.0
"""How long `start` waits for the publisher's first round (registration and snapshot) at most."""


def new_epoch() -> int:
    """A fresh incarnation number: microseconds since the epoch, so it rises across restarts."""
    return time.time_ns() // 1000


class NodeAgent:
    """Executes ServePlans on one node. Use: `await start()`, then `serve(...)`, then `await stop()`.

    `serve` raises InvalidRequest for a plan it refuses (nothing is pulled, taken or queued); it never
    fails because a peer misbehaved (missing blocks are recomputed, `pull_failed` says so).
    """

    def __init__(self, config: AgentConfig, *, clock: Callable[[], float] = time.perf_counter,
                 epoch: int | None = None) -> None:
        """`clock` times TTFT, decode and pulls (the engine uses it too); `epoch` defaults to new_epoch()."""
        self.config = config
        self.node: NodeId = config.node_id
        self.epoch = epoch if epoch is not None else new_epoch()
        self._clock = clock
        self._runner: EngineRunner | None = None
        self._transfer: TransferPlane = NoTransfer()
        self.publisher: EventPublisher | None = None
        self.kv_events: KVEventsOut = NoKVEvents()
        """The same cache events in vLLM's ZMQ format (config.kv_events_endpoint)."""
        self.counters = AgentCounters()
        self._hits = PendingHits(MAX_HITS_PER_HEARTBEAT)
        """Realized hits until the publisher's next heartbeat takes them; bounded, since nothing takes
        them on a standalone agent."""
        self._recalled = RecallWindow(config.recall_blocks)
        """The cluster's ghost as the leases report it; read by the gpu pool on the engine thread."""
        self._metrics_server: MetricsServer | None = None
        self._pulls: set[asyncio.Task[Pulled]] = set()
        """Pulls streaming for requests being served (each lands its blocks when it ends)."""
        self._first_round: asyncio.Future[None] | None = None
        """The publisher's first round, which `start` waits for (FIRST_ROUND_S at most)."""
        self._stirred = asyncio.Event()
        """Set when take_events may find events it did not last time: an engine job has ended since
        (the runner sets it), or the disk writer was still writing then."""

    # --- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        """Build the model and engine (off the event loop), then start the transfer plane. When a
        part cannot start (ValueError: e.g. transfer="ray" outside an agent actor) the parts already
        started are stopped again before the error propagates."""
        hooks = PoolHooks(recalled=self._recalled.take) if self.config.recall_blocks else None
        built = await build_engine(self.config, self._clock, hooks)
        engine = built.engine
        self._runner = EngineRunner(engine, clock=self._clock, on_job_end=self._stirred.set)
        try:
            memory = self.memory
            # The plane moves the gpu tier's KV itself: a data plane beside the door, as vLLM's KV connector.
            # Peers following this node's prefills (a streamed hand-off) wait on its runner's steps.
            self._transfer = make_transfer_plane(memory.gpu, engine.layout, transfer_config(self.config, engine.layout),
                                                 self._runner.call_short, progress=self._runner)
            await self._transfer.start()
            if self.config.kv_events_endpoint is not None:  # before the metadata publisher drains events
                book = TokenBook(engine.layout.block_size, engine.config.memory.hash_key,
                                 max_unheld=2 * memory.tier_blocks)
                self.kv_events = ZmqKVEventPublisher(self.config.kv_events_endpoint, book,
                                                     token_ids=self.config.kv_events_token_ids,
                                                     secret=self.config.secret)
                await self.kv_events.start()
            if self.config.metadata_address is not None:
                client = MetadataClient(self.config.metadata_address,
                                        credentials=CallerCredentials.node(self.config.secret, self.node),
                                        root_certificates=self.config.metadata_root_certificates)
                self.publisher = EventPublisher(self, client, PublisherConfig(
                    self.config.publish_interval_s, self.config.heartbeat_interval_s))
                await self.publisher.start()
                # The first round registers and sends the snapshot (a restarted node's disk blocks):
                # waited for, so that requests routed as soon as `up` returns find them (a restart at
                # up's pool sizes: 0.88 of tokens cached without the wait, 0.95-0.96 with it, against
                # 0.976 before the restart). Not cancelled past the bound: it goes on in the background.
                self._first_round = asyncio.ensure_future(self.publisher.flush())
                await asyncio.wait([self._first_round], timeout=FIRST_ROUND_S)
            if self.config.metrics_port is not None:
                self._metrics_server = MetricsServer.for_agent(self.prometheus_text, self.config.host,
                                                               self.config.metrics_port, self.config.secret,
                                                               tls=self.config.metrics_tls)
                await self._metrics_server.start()
        except BaseException:
            await self.stop()
            raise
        logger.info("agent %s epoch %d up: %s on %s (torch threads %d), layout %s, transfer %s at %s "
                    "(memory path %s), eviction %s, hand-off %s, engine %s", self.node, self.epoch,
                    self.config.model.name, built.device, built.threads, engine.layout.fingerprint(),
                    self._transfer.transport, self.transfer_address or "-", self._transfer.memory_path or "-",
                    engine.config.memory.pool.eviction, "on" if self.config.handoff else "off",
                    self.config.engine_label)

    async def stop(self) -> None:
        """Abort what runs, stop /metrics, the publishers, the transfer plane and the engine thread.
        Idempotent."""
        for pull in self._pulls:
            pull.cancel()
        await asyncio.gather(*self._pulls, return_exceptions=True)  # landed before the engine stops
        if self._metrics_server is not None:
            await self._metrics_server.stop()
            self._metrics_server = None
        if self._first_round is not None:  # still waiting for an unreachable service
            self._first_round.cancel()
            await asyncio.gather(self._first_round, return_exceptions=True)
            self._first_round = None
        if self.publisher is not None:
            await self.publisher.stop()
            self.publisher = None
        await self.kv_events.stop()
        self.kv_events = NoKVEvents()
        await self._transfer.stop()
        self._transfer = NoTransfer()
        if self._runner is not None:
            await self._runner.close()
            await asyncio.to_thread(self.memory.close)  # after the engine thread: a warm restart
            self._runner = None

    @property
    def runner(self) -> EngineRunner:
        if self._runner is None:
            raise RuntimeError(f"agent {self.node} is not started")
        return self._runner

    @property
    def engine(self) -> Engine:
        return self.runner.engine

    @property
    def memory(self) -> NodeMemory:
        """The node's memory: the agent's one handle on it (on the engine thread, as the engine)."""
        return self.engine.memory

    @property
    def layout(self) -> KVLayout:
        return self.engine.layout

    @property
    def transfer_address(self) -> str:
        """Where peers pull from: host:port of the transfer server, "ray:<actor name>" under the Ray
        transport, "" without a transfer plane."""
        return self._transfer.address

    async def serve_pull(self, request: bytes) -> AsyncIterator[Any]:
        """Serve one peer's pull through the object store (the agent actor's `pull`); TransportError
        unless this agent's transport is ray."""
        async for item in self._transfer.serve_pull(request):
            yield item

    # --- serving -----------------------------------------------------------------------------
    async def serve(self, plan: ServePlan) -> AsyncGenerator[ServeItem, None]:
        """Yield TokenDelta items as tokens come, then one ServeResult.

        A prefill-only plan yields Queued first, once its request is in the engine, and its result
        carries no token. A planned pull does not delay the request: it is queued at once, its pull's blocks allocated
        in the same engine job (Request.pending_prefix), and the engine admits it once the pull has
        landed (one more engine job); meanwhile the chunks are written into the blocks off the
        engine thread, and the engine steps the other requests."""
        t0 = self._clock()
        self._check(plan)
        salt = tenant_salt(plan.tenant)
        # The one hashing of this prompt on this node: the pull, the engine's checks and its block
        # table all use these (Request.prompt_hashes).
        hashes = self.memory.hash_prompt(plan.prompt_token_ids, salt)
        pending = pending_prefix(plan, self.layout.block_size, self._transfer)
        rid = RequestId(plan.request_id)
        request = Request(rid, plan.prompt_token_ids, plan.sampling, salt, prompt_hashes=tuple(hashes),
                          pending_prefix=pending, prefill_only=plan.prefill_only)
        pull: asyncio.Task[Pulled] | None = None
        finished = False
        ticket = self.kv_events.open(plan.prompt_token_ids, hashes, plan.tenant)
        try:
            queue = await self.runner.submit(request)
            if pending is not None and pending.block_ids:
                pull = asyncio.create_task(pull_prefix(plan, pending, self._transfer, self.runner),
                                           name=f"pull-{plan.request_id}")
                self._pulls.add(pull)
                pull.add_done_callback(self._pulls.discard)
            if plan.prefill_only:  # in the engine now: a decode agent's pull may follow its blocks
                yield Queued(plan.request_id)
            while True:
                match await queue.get():
                    case NewTokens() as new:
                        self.kv_events.extend(ticket, new.token_ids)
                        yield TokenDelta(plan.request_id, tuple(new.token_ids), tuple(new.logprobs))
                    case Finished() as done:
                        finished = True
                        if self.publisher is None:  # standalone: nobody drains the events, so they would pile up
                            await self.runner.call(self._drain_events)
                        # Admitted only after its pull landed, so the pull is over here.
                        pulled = await pull if pull is not None else unpulled(plan, pending)
                        yield self._result(plan, done, pulled, t0)
                        return
                    case error:
                        raise RuntimeError(f"engine of {self.node} failed") from error
        finally:
            self.kv_events.close(ticket)
            if not finished:  # refused, the consumer went away or the engine failed: free its blocks
                logger.info("request %s ended on %s before its result", plan.request_id, self.node)
                if pull is not None:
                    pull.cancel()  # it lands (frees) its blocks once nothing can write them
                elif pending is not None:  # gone while being queued: the blocks, if any, were never written
                    await self.runner.call(self.engine.land_pull, pending, 0)
                await self.runner.abort(rid)

    async def reset_prefix_cache(self) -> dict[str, int]:
        """Drop every cached block nothing holds, on every tier (NodeMemory.reset_prefix_cache), and
        publish the removals before returning, so the metadata service's index has dropped them too.
        Blocks a peer's pull pins stay. AgentBusy, with nothing dropped, while a request is queued or
        running here. Returns the blocks dropped per tier."""
        # No await between the check and queuing the job: a request that is not counted here is
        # submitted after the reset, on the engine thread's queue.
        if self.runner.active_requests:
            raise AgentBusy(f"agent {self.node} has {self.runner.active_requests} request(s) running")
        dropped = await self.runner.call(self.memory.reset_prefix_cache)
        if self.publisher is not None:
            await self.publisher.flush()
        else:  # standalone: nobody else drains the events
            await self.runner.call(self._drain_events)
        logger.info("agent %s prefix cache reset: dropped %s cached blocks", self.node,
                    ", ".join(f"{n} {tier}" for tier, n in dropped.items()))
        return dropped

    def _check(self, plan: ServePlan) -> None:
        """Refuse, before anything is pulled, what the engine would refuse (it checks again)."""
        self.engine.limits.check(plan.prompt_token_ids, plan.sampling.max_tokens)
        if self.runner.active_requests >= self.config.max_requests:
            raise AgentBusy(f"agent {self.node} holds {self.runner.active_requests} requests already")
        if self.runner.is_active(RequestId(plan.request_id)):
            raise InvalidRequest(f"request id {plan.request_id!r} is already being served")
        check_pull(plan, self.node, self.layout.block_size)
        if plan.prefill_only and plan.handoff:
            raise InvalidRequest("a plan is a prefill phase or a hand-off's decode phase, not both")

    def _result(self, plan: ServePlan, done: Finished, pulled: Pulled, t0: float) -> ServeResult:
        out = done.output
        assert out.stats.sources is not None, "a finished request was admitted"
        first = out.stats.first_token_s if out.stats.first_token_s is not None else self._clock()
        stats = ServeStats(out.stats.sources, pull_bytes=pulled.nbytes, pull_seconds=pulled.seconds,
                           pull_failed=pulled.failed, ttft_s=first - t0, decode_s=out.stats.decode_s or 0.0,
                           preemptions=out.stats.preemptions)
        self.counters.count_request(stats)
        if not plan.handoff:  # a hand-off's prompt was counted on its prefill agent
            self._hits.add((RequestHits(plan.request_id, plan.tenant, out.stats.sources),))
        logger.info("request %s served on %s: %d prompt tokens (%d cached), %d output, %s, ttft %.3fs",
                    plan.request_id, self.node, len(plan.prompt_token_ids),
                    out.stats.sources.hits, len(out.output_token_ids),
                    out.finish_reason.value, stats.ttft_s)
        return ServeResult(plan.request_id, self.node, out.output_token_ids, out.finish_reason, stats,
                           out.logprobs)

    # --- what the publisher and the metrics read --------------------------------------------
    def next_epoch(self) -> int:
        """A new incarnation of this node (its lease ended while it kept running): a higher epoch."""
        self.epoch = max(new_epoch(), self.epoch + 1)
        return self.epoch

    def node_info(self) -> NodeInfo:
        """What RegisterNode declares for this incarnation (its capacity: NodeMemory.capacity)."""
        return NodeInfo(self.node, self.epoch, self.layout.fingerprint(), self.layout.block_size,
                        self.block_bytes, self.transfer_address, self.memory.capacity(), self.config.role)

    @property
    def block_bytes(self) -> int:
        """What one block's KV weighs on the wire, as the router prices pulls: a modeled engine's
        blocks stand for the profile's full KV (their pulls are counted and timed in it)."""
        modeled = self.config.modeled
        return self.layout.block_bytes if modeled is None else modeled.wire_block_bytes(self.layout.block_size)

    async def take_events(self) -> list[CacheEvent]:
        """Drain every tier's cache events since the last call (gpu first). With none waiting, no
        engine job: hops to the engine thread for nothing, 20 a second, were most of an idle agent's
        CPU (docs/routing.md#the-nodes-event-publisher)."""
        self._stirred.clear()  # before looking: a job that ends from here on sets it again
        memory = self.memory
        if memory.disk_writing():  # the writer's events come without a job: look again next round
            self._stirred.set()
        if not memory.has_events():
            return []
        return await self.runner.call(self._drain_events)

    async def wait_for_events(self) -> None:
        """Return once take_events may find events it did not last time (PublishedNode)."""
        await self._stirred.wait()

    async def snapshot(self) -> tuple[BlockStored, ...]:
        """Every cached block as chains (NodeMemory.snapshot); pending events are drained in the
        same engine step, so the snapshot covers exactly what they said."""
        def every_tier() -> tuple[BlockStored, ...]:
            self._drain_events()
            return self.memory.snapshot()
        return await self.runner.call(every_tier)

    def _drain_events(self) -> list[CacheEvent]:
        """The one drain of every tier's events: the vLLM-format publisher sees each too."""
        events = self.memory.take_events()
        self.kv_events.offer(events)
        return events

    async def recall(self, hashes: Sequence[BlockHash]) -> None:
        """Remember the cluster's last-copy evictions a lease reported; on the engine thread, where
        the pool reads them."""
        await self.runner.call(self._recalled.lose, hashes)

    def take_hits(self) -> list[RequestHits]:
        """Drain the realized hits of the requests finished since the last call."""
        return self._hits.take()

    async def load(self) -> NodeLoad:
        """Queue, running tokens, free blocks, and the prices the router's cost model reads: measured
        step floor and prefill rate beyond it, per-peer pull bandwidth and fixed cost, the disk tier's read rate, and the compute
        group (who shares our cores)."""
        def snapshot() -> tuple[int, int, int]:
            sched = self.engine.scheduler
            return len(sched.waiting), sum(len(s.tokens) for s in sched.running), self.memory.free_blocks
        queued, running, free = await self.runner.call(snapshot)
        gbps = self._transfer.peer_gbps()
        fixed = {str(peer): s.ewma_latency_s for peer, s in self._transfer.peer_stats().items() if s.ewma_latency_s > 0}
        # A modeled engine's steps are timed waits, not work on these cores: each modeled agent stands
        # for a device of its own and shares none (priced as sharing, the router thought a modeled
        # cluster's nodes twice as slow as they were: TTFT realized / estimated 0.56 at p50).
        group = "" if self.config.modeled is not None else compute_group(self.engine.device)
        return NodeLoad(queued, running, free, self.runner.prefill_tokens_per_s, gbps, fixed,
                        group, self.memory.disk_read_bytes_per_s() / 1e9, self.runner.step_floor_s,
                        compute_share(self.engine.device) if group else 0.0)

    async def prometheus_text(self) -> str:
        """Memory of both tiers, the engine, the transfer plane and the agent's own counters."""
        labels = {"model_name": self.config.model_name}
        text = await self.runner.call(self.engine.prometheus_text, labels)
        if self.publisher is not None:
            self.counters.background_errors = self.publisher.loop_errors
        peers = self._transfer.peer_stats()
        dropped = self._hits.dropped + (self.publisher.hits_dropped if self.publisher is not None else 0)
        expiries = self.publisher.lease_expiries if self.publisher is not None else 0
        return (text + render_agent_metrics(self.node, self.counters, peers, self._transfer.memory_path, labels,
                                            eviction=self.config.engine.memory.pool.eviction,
                                            handoff=self.config.handoff, engine=self.config.engine_label)
                + render_prometheus([PublisherStats(self.node, dropped, expiries)], labels))

    def scrape_target(self) -> ScrapeTarget | None:
        """Where Prometheus scrapes this agent itself (None: it serves no /metrics of its own)."""
        if self._metrics_server is None:
            return None
        return ScrapeTarget(self._metrics_server.address, self.node, self.config.zone,
                            scheme=self._metrics_server.scheme)

    async def check_invariants(self) -> None:
        """The engine's and both tiers' invariants (raises AssertionError with the numbers)."""
        await self.runner.call(self.engine.check_invariants)

    def __repr__(self) -> str:
        return f"NodeAgent({self.node!r}, epoch={self.epoch})"
