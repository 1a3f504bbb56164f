"""The global router: one request in, the node where it starts fastest chosen, its tokens streamed back.

Per request: hash the prompt's full blocks with the tenant salt, match them on the router's index
replica or, while it is not in sync, by `Match` (match_source, with the degraded mode), and run the
one routing step (policy.step.RoutingStep) over that answer, the in-flight table and the pending
holders; send the agent the ServePlan (with a PullPlan when the decision pulls from a peer). The
pending hold stands while the agent has not answered, and for `pending_ttl_s` after its first token.
Retries (attempts): an agent unavailable before or during the stream is excluded and the request
routed again; the seed fixed here reproduces the same tokens, and those already sent are skipped.
A node whose attempt failed is avoided for a while (suspects).
Sessions: a request with a session key follows its session's node while that node is a candidate
within the load bound (session_affinity). Reset: cache_reset. docs/routing.md tells the whole story.
A directory with prefill and decode agents serves each request in two phases (disaggregation.py).
"""

import asyncio
import contextlib
import dataclasses
import logging
import random
import time
import uuid
from collections.abc import AsyncGenerator, Callable

from radixmesh.cluster.fleet.agent_client import AgentDirectory
from radixmesh.cluster.policy.base import RoutePolicy, RouteRequest, make_policy
from radixmesh.cluster.policy.inflight import InflightTable
from radixmesh.cluster.policy.pending_index import PendingIndex
from radixmesh.cluster.policy.step import Routed, RoutingStep
from radixmesh.cluster.router.admission import Admission, Overloaded
from radixmesh.cluster.router.attempts import Attempts
from radixmesh.cluster.router.cache_reset import CacheReset, RequestsRunning, reset_agents
from radixmesh.cluster.router.config import RouterConfig
from radixmesh.cluster.router.disaggregation import (
    DecodeAttempts,
    DecodePicker,
    Disaggregation,
    PrefillAttempts,
    is_split,
    local_holder,
    nodes_of,
)
from radixmesh.cluster.router.index_watch import IndexWatcher
from radixmesh.cluster.router.match_source import MatchSource
from radixmesh.cluster.router.metrics import RouterMetrics
from radixmesh.cluster.router.prediction_report import PredictionReporter
from radixmesh.cluster.router.results import NoNodeAvailable, RoutedPlan, RouterItem, RouterResult
from radixmesh.cluster.router.session_affinity import SessionAffinity, SessionConfig, within_bound
from radixmesh.cluster.router.suspects import Suspects
from radixmesh.common.metadata.client import MetadataClient
from radixmesh.proto.block_hash import BlockHash, hash_blocks, tenant_salt
from radixmesh.proto.ids import NodeId
from radixmesh.proto.metadata.messages import IndexUpdate, MatchResult, NodeMatch
from radixmesh.proto.serve.limits import InvalidRequest, usable_prefix_blocks
from radixmesh.proto.serve.plan import PullPlan, ServePlan, TokenDelta
from radixmesh.proto.serve.sampling import draw_seed

logger = logging.getLogger(__name__)


class Router:
    """Routes requests over the agents of `directory`. Use from one event loop."""

    def __init__(
        self,
        config: RouterConfig,
        directory: AgentDirectory,
        metadata: MetadataClient | None,
        *,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        sessions: SessionConfig | None = None,
    ) -> None:
        """`metadata` None routes by the fallback policy for good (no prefix knowledge at all).
        `clock` times TTFT, pending expiry, metadata retries and session expiry; `rng` draws seeds and
        tie-breaks; `sessions` bounds the session map (SessionConfig's defaults)."""
        self.config = config
        self.directory = directory
        self.metadata = metadata
        self.metrics = RouterMetrics(config.model_name)
        self.admission = Admission(config.admission, lambda: len(directory.nodes()))
        self.metrics.admission = self.admission
        self.metrics.role_inflight = self._inflight_by_role
        self._clock = clock
        self._rng = rng or random.Random()
        self._policy: RoutePolicy = make_policy(config.policy, config.policy_config, random.Random(self._rng.random()))
        self._fallback: RoutePolicy = make_policy(
            config.fallback_policy, config.policy_config, random.Random(self._rng.random())
        )
        self._pending = self._new_pending()
        self._inflight = InflightTable(clock, config.policy_config.load_half_life_s)
        self._step = RoutingStep(self._policy, self._pending, self._inflight, block_tokens=config.block_size,
                                 default_prefill_tokens_per_s=config.default_prefill_tokens_per_s,
                                 least_loaded=config.least_loaded_candidates, fallback=self._fallback)
        self._sessions = SessionAffinity(sessions or SessionConfig(), clock)
        self.suspects = Suspects(clock)
        """Nodes whose last attempt failed, not routed to for a while (suspects.py)."""
        self._attempts = Attempts(config, directory, self.plan, self._step, self._inflight, self.metrics,
                                  self.suspects, clock)
        picker = DecodePicker(directory, self._inflight, self.suspects, self._free_blocks, self._record_decode)
        self._split = Disaggregation(
            PrefillAttempts(config, directory, self._plan_prefill, self._step, self._inflight, self.metrics,
                            self.suspects, clock),
            DecodeAttempts(config, directory, picker.plan, self._step, self._inflight, self.metrics, self.suspects,
                           clock),
            Attempts(config, directory, self._plan_local, self._step, self._inflight, self.metrics, self.suspects,
                     clock),
            self._local_holder, directory, self._transfer_address, config.block_size, clock, self.metrics,
            config.stream_handoff)
        """Serves requests in two phases while the directory holds prefill and decode agents."""
        self._running = 0
        """Requests in `generate` now (validated, admitted or waiting for admission)."""
        self._idle = asyncio.Event()
        self._idle.set()
        self.router_id = f"router-{uuid.uuid4().hex[:12]}"
        """Names this router's routed work in the metadata stream (router replicas share load)."""
        replica_source = metadata if config.index_replica else None
        self.watcher = (IndexWatcher(replica_source, retry_s=config.metadata_retry_s, on_update=self._others_work)
                        if replica_source is not None else None)
        """Keeps the router's index replica; started by the first request (it needs the loop)."""
        self._reporter = PredictionReporter(replica_source, self.router_id) if replica_source is not None else None
        self._source = MatchSource(config, metadata, self.watcher, self.metrics, clock,
                                   policy=self._policy.name, fallback=self._fallback.name)
        self.scraped_nodes: frozenset[NodeId] = frozenset()
        """Agents Prometheus scrapes directly (file_sd keeps it): `/metrics?scope=router` leaves them out."""

    # --- state --------------------------------------------------------------------------------
    def _new_pending(self) -> PendingIndex:
        return PendingIndex(self.config.pending_ttl_s, self._clock, max_hold_s=self.config.pending_max_s)

    @property
    def metadata_available(self) -> bool:
        """False while requests are routed without prefix knowledge."""
        return self._source.available

    @property
    def replica_decisions(self) -> int:
        """Decisions made on the replica (the rest asked Match or had no prefix knowledge)."""
        return self._source.replica_decisions

    @property
    def active_policy(self) -> str:
        return self._policy.name if self.metadata_available else self._fallback.name

    def inflight(self, node: NodeId) -> int:
        return self._inflight.inflight(node)

    def recent_tokens(self, node: NodeId) -> float:
        """Prompt tokens recently routed to `node` by this router and, through the metadata stream,
        by the other routers (decayed; the bounded-load measure)."""
        return self._inflight.recent_tokens(node)

    def check_invariants(self) -> None:
        self._inflight.check_invariants()
        self._pending.check_invariants()
        self._sessions.check_invariants()
        assert self._running >= 0 and self._idle.is_set() == (self._running == 0), f"running={self._running}"

    @property
    def running(self) -> int:
        """Requests being served (or waiting for admission) by this router now."""
        return self._running

    def session_node(self, session: str) -> NodeId | None:
        """The node `session`'s next request goes to while that node stays within the load bound."""
        return self._sessions.node(session)

    def start(self) -> None:
        """Start watching the index now (the first request does it otherwise); needs a running loop."""
        if self.watcher is not None:
            self.watcher.start()

    async def close(self) -> None:
        """Stop the index watch and the prediction reports; routing continues on Match."""
        if self.watcher is not None:
            await self.watcher.close()
        if self._reporter is not None:
            await self._reporter.close()

    # --- routing ------------------------------------------------------------------------------
    def block_hashes(self, request: ServePlan) -> list[BlockHash]:
        """The prompt's full-block hashes as the agents compute them (tenant salt, cluster key)."""
        salt = tenant_salt(request.tenant)
        return hash_blocks(request.prompt_token_ids, self.config.block_size, salt=salt, key=self.config.hash_key)

    async def plan(self, request: ServePlan, exclude: frozenset[NodeId] = frozenset(),
                   node: NodeId | None = None, session: str | None = None, *,
                   among: frozenset[NodeId] | None = None) -> RoutedPlan:
        """Decide where `request` goes (never to a node of `exclude`; to `node` while it is a candidate;
        else to `session`'s node while it is a candidate within the load bound) and hold the
        decision as pending (RoutingStep): the caller that serves it ends the hold (`RoutedPlan.hold`,
        RoutingStep.answered / abandon), else it lasts `pending_max_s`. Raises NoNodeAvailable when
        no candidate is left. Suspects are avoided while another node is left. `among`: only these
        nodes may serve it; the others may still be pulled from (a split cluster's prefill phase)."""
        peers = frozenset(n for n in self.directory.nodes() if n not in among) if among is not None else frozenset()
        suspects = self.suspects.current()
        if suspects:  # (no pass over the directory while there are none: a decision's cost stays the holders')
            avoid = exclude | suspects
            pool = self.directory.nodes() if among is None else among
            exclude = avoid if any(n not in avoid for n in pool) else exclude
        hashes = self.block_hashes(request)[: self.config.max_match_blocks]
        tokens = len(request.prompt_token_ids)
        replicated = self._source.replica_match(hashes)
        match = await self._source.match(hashes, request) if replicated is None else None
        sticky = self._sessions.node(session) if session is not None and node is None else None
        try:
            # With a sticky node the policy's choice is recorded only once it stands.
            routed = self._route(hashes, tokens, replicated, match, exclude, node, peers, record=sticky is None)
            if sticky is not None:
                asked = RouteRequest(tokens, len(hashes), self.config.block_size)
                if sticky != routed.decision.node and within_bound(sticky, routed.view.cluster, asked,
                                                                   self.config.policy_config):
                    routed = self._route(hashes, tokens, replicated, match, exclude, sticky, peers, record=True)
                else:
                    routed = dataclasses.replace(routed, hold=self._pending.hold(routed.decision.node, hashes))
        except NoNodeAvailable:
            raise NoNodeAvailable(f"no node left to serve request {request.request_id}") from None
        if session is not None:
            self._sessions.remember(session, routed.decision.node)
        decision, view = routed.decision, routed.view
        if replicated is not None and self._reporter is not None and self.watcher is not None:
            # The work it brings there, as the recent-work measure counts it (Attempts.serve).
            computed = tokens - min(decision.local_blocks + decision.pull_blocks,
                                    usable_prefix_blocks(tokens, self.config.block_size)) * self.config.block_size
            self._reporter.add(self.watcher.replica.prediction(request.request_id, replicated, decision.node, computed))
        self.metrics.record_decision(routed.policy, decision.node)
        self.metrics.record_role(self.directory.role(decision.node))
        pull = None
        address = view.addresses.get(decision.pull_from) if decision.pull_from is not None else None
        if decision.pull_from is not None and decision.pull_blocks > 0 and address:
            pull = PullPlan(decision.pull_from, address, decision.local_blocks, decision.pull_blocks)
        plan = dataclasses.replace(request, pull=pull, expected_local_blocks=decision.local_blocks)
        logger.debug("request %s -> %s (%s): %s", request.request_id, decision.node, routed.policy, decision.reason)
        return RoutedPlan(plan, decision, routed.policy, view.cluster_blocks * self.config.block_size,
                          routed.match is not None, view.cluster, tuple(hashes), routed.hold)

    def _route(self, hashes: list[BlockHash], tokens: int, replicated: MatchResult | None,
               match: MatchResult | None, exclude: frozenset[NodeId], pin: NodeId | None,
               peers: frozenset[NodeId], *, record: bool) -> Routed:
        """The routing step on the replica's answer (`replicated`) or on Match's (`match`, None: no
        prefix knowledge); `peers` are pulled from, never chosen."""
        if replicated is not None:
            assert self.watcher is not None
            replica, directory = self.watcher.replica, self.directory
            return self._step.route(
                hashes, tokens, replicated, directory.nodes(), narrow=True, exclude=exclude, pin=pin,
                usable=lambda n: replica.is_live(n) and directory.get(n) is not None,
                describe=self._described, record=record, peers=peers)
        candidates = [n for n in self.directory.nodes() if n not in exclude]
        if match is not None:
            live = {m.node_id for m in match.nodes}
            # The directory says who is reachable, the lease who is alive; agents that never
            # registered (standalone) are still served rather than refused.
            candidates = [n for n in candidates if n in live] or candidates
        return self._step.route(hashes, tokens, match, candidates, pin=pin, record=record, peers=peers)

    async def _plan_prefill(self, request: ServePlan, exclude: frozenset[NodeId], node: NodeId | None,
                            session: str | None) -> RoutedPlan:
        """`plan` among the prefill agents (a split cluster's first phase)."""
        return await self.plan(request, exclude, node, session, among=nodes_of(self.directory, "prefill"))

    async def _plan_local(self, request: ServePlan, exclude: frozenset[NodeId], node: NodeId | None,
                          session: str | None) -> RoutedPlan:
        """`plan` among the decode agents: a split cluster's request served whole on one (Disaggregation)."""
        try:
            return await self.plan(request, exclude, node, session, among=nodes_of(self.directory, "decode"))
        except NoNodeAvailable:  # as the two-phase path says it (DecodePicker)
            raise NoNodeAvailable(f"no decode agent left to serve request {request.request_id}") from None

    def _local_holder(self, request: ServePlan) -> NodeId | None:
        """disaggregation.local_holder on the replica (None while it is not in sync: Match is asked
        once per request, by the plan)."""
        limit = self.config.local_prefill_max_tokens
        if limit <= 0 or self.watcher is None or not self.watcher.replica.in_sync:
            return None
        hashes = self.block_hashes(request)[: self.config.max_match_blocks]
        match = self.watcher.replica.match(self.config.layout, hashes)
        return local_holder(match, nodes_of(self.directory, "decode") - self.suspects.current(),
                            len(request.prompt_token_ids), self.config.block_size, limit)

    def _record_decode(self, policy: str, node: NodeId) -> None:
        self.metrics.record_decision(policy, node)
        self.metrics.record_role(self.directory.role(node))

    def _inflight_by_role(self) -> dict[str, int]:
        """Requests in flight here by the role of their agent (every role present, 0 included)."""
        out: dict[str, int] = {}
        for n in self.directory.nodes():
            role = self.directory.role(n)
            out[role] = out.get(role, 0) + self._inflight.inflight(n)
        return out

    def _free_blocks(self, node: NodeId) -> int:
        """`node`'s free blocks as it last heartbeated them (0 while the replica does not know it)."""
        watched = self.watcher.replica.node(node) if self.watcher is not None else None
        return watched.load.free_blocks if watched is not None else 0

    def _transfer_address(self, node: NodeId) -> str:
        """`node`'s transfer address as it registered it ("" while the replica does not know it)."""
        watched = self.watcher.replica.node(node) if self.watcher is not None else None
        return watched.transfer_address if watched is not None else ""

    def _described(self, node: NodeId) -> NodeMatch:
        """A least-loaded candidate as the replica knows it: no blocks, its heartbeated load."""
        assert self.watcher is not None
        w = self.watcher.replica.node(node)
        assert w is not None
        return NodeMatch(node, w.transfer_address, 0, 0, 0, w.load)

    def _others_work(self, update: IndexUpdate) -> None:
        """Other routers' work counts here too (unshared, two routers lost 2.2 points at 64 nodes). A
        node that left comes back with none: its old work would keep it over the load cap, idle. A
        node that registered afresh (it leaves and joins in one update) is no suspect any more."""
        for node in update.left:
            self._inflight.forget_recent(node)
        for joined in update.nodes:
            if joined.node_id in update.left:
                self.suspects.seen_alive(joined.node_id)
        for w in update.work:
            if w.router_id != self.router_id:
                self._inflight.record_routed(w.node_id, w.tokens)

    # --- serving ------------------------------------------------------------------------------
    def validate(self, request: ServePlan) -> None:
        """InvalidRequest for what the agents would refuse (the prompt limits of their model)."""
        self.config.limits.check(request.prompt_token_ids, request.sampling.max_tokens)

    async def generate(self, request: ServePlan, on_routed: Callable[[NodeId], None] | None = None,
                       node: NodeId | None = None, session: str | None = None
                       ) -> AsyncGenerator[RouterItem, None]:
        """Yield TokenDelta items (each token once, in order, across retries), then one RouterResult;
        `on_routed` hears the node of each attempt as soon as it is chosen. `request` is a plan without
        a pull (the router plans that); `node`: serve there while it is a candidate (choices 2..n of
        one prompt follow the first to its cached prefix), else routed as any request; `session`: the
        caller's session key (session affinity, see the module doc).

        Raises InvalidRequest (nothing routed, or an agent refused it), Overloaded (admission control
        refused it: nothing routed) or NoNodeAvailable after `max_attempts` nodes failed.
        """
        status = "error"
        arrival = self._clock()
        self._running += 1
        self._idle.clear()
        try:
            self.validate(request)
            async with self.admission.slot():
                self.metrics.queue.observe(self._clock() - arrival)
                seeded = self._with_seed(request)
                served = (self._split.serve(seeded, on_routed, node, session) if is_split(self.directory)
                          else self._attempts.serve(seeded, on_routed, node, session))
                async with contextlib.aclosing(served) as items:
                    last: float | None = None
                    async for item in items:
                        now = self._clock()
                        if isinstance(item, RouterResult):
                            status = "ok"  # counted as served even if the consumer stops reading now
                            self.metrics.e2e.observe(now - arrival)
                        elif last is not None:
                            for _ in item.token_ids:  # a delta of n tokens: n gaps of (now - last) / n
                                self.metrics.inter_token.observe((now - last) / len(item.token_ids))
                        last = now if isinstance(item, TokenDelta) else last
                        yield item
        except InvalidRequest:
            status = "invalid"
            raise
        except Overloaded:
            status = "refused"
            raise
        except NoNodeAvailable:
            status = "unavailable"
            raise
        except (GeneratorExit, asyncio.CancelledError):
            status = "ok" if status == "ok" else "cancelled"
            raise
        finally:
            self.metrics.record_request(status)
            self._running -= 1
            if not self._running:
                self._idle.set()

    async def complete(self, request: ServePlan) -> RouterResult:
        """`generate` run to its end."""
        # aclosing: the request's admission slot and stream end here, not when the generator is collected
        async with contextlib.aclosing(self.generate(request)) as items:
            async for item in items:
                if isinstance(item, RouterResult):
                    return item
        raise AssertionError("generate ended without a result")

    async def reset_prefix_cache(self, *, wait_s: float | None = None) -> CacheReset:
        """Drop the cached blocks of every agent (CacheResettable: each publishes the removals before
        it answers, so the index drops them too) and forget this router's pending holders.

        While requests run here it raises RequestsRunning and resets nothing, unless `wait_s` is
        given: then it waits up to that long for them to end (RequestsRunning past it; requests that
        arrive meanwhile prolong the wait). Agents reset concurrently; one that refuses (requests of
        another router run on it) or fails is reported in the result, the others still reset."""
        if self._running:
            if wait_s is None:
                raise RequestsRunning(f"{self._running} request(s) running: retry once they end, or ask to wait")
            try:
                async with asyncio.timeout(wait_s):
                    await self._idle.wait()
            except TimeoutError:
                raise RequestsRunning(f"{self._running} request(s) still running after {wait_s:g} s") from None
        reset = await reset_agents(self.directory)
        self._pending = self._new_pending()
        self._step.pending = self._pending
        return reset

    def _with_seed(self, request: ServePlan) -> ServePlan:
        if request.sampling.seed is not None:
            return request
        sampling = dataclasses.replace(request.sampling, seed=draw_seed(self._rng))
        return dataclasses.replace(request, sampling=sampling)
