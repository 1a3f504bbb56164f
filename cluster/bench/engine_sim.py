"""The engine simulator: a bench cell of a modeled cluster replayed in virtual time, with the production
code everywhere but the network, so it ranks routers as the live modeled cluster does, in seconds and
without the host's cores in the figures (`radixmesh bench --local N --engine modeled:P --simulate`).

What runs as on a live `bench --local N --engine modeled:P` cell:
- each node is the agent's own `Engine` (scheduler, chunked prefill, pool, prefix cache, preemption)
  over the modeled forward, its step waits taken on the node's virtual clock (node_agent's
  VirtualNode);
- the router's routing step, policy, pending holders, load table (InflightTable), calibration (the
  move margin and pull time factor) and admission limits (running slots, a waiting queue up to its
  bound and wait, then 429), on the same RouterConfig the launcher builds;
- the nodes' heartbeated prices are their engines' StepRates, as an agent reports them;
- pulls are Engine pending prefixes, landed after the profile's wire time and the pull latency the
  router prices, with what the peer still holds then.

What does not: the index learns a node's blocks at the end of the step that made them (live: the
agent's next publish, 50 ms, and the replica's lag); a pull moves no bytes and never fails; a peer
still prefilling a pulled prefix sends only what it has cached (live: it may follow the prefill);
split (prefill/decode) arms and the warm-up requests are not simulated; a request that waited for
an admission slot is routed the moment one frees (live: the next event loop turn).
"""

import heapq
import itertools
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from radixmesh.cluster.bench.arms import Arm, LocalClusters
from radixmesh.cluster.bench.client import Outcome, RequestResult
from radixmesh.cluster.bench.metrics import summarise
from radixmesh.cluster.bench.runner import BenchPlan, SimulatedCell
from radixmesh.cluster.bench.schedule import BenchRequest, count_sessions
from radixmesh.cluster.launch.config import LauncherConfig
from radixmesh.cluster.metadata.index import GlobalIndex
from radixmesh.cluster.policy.base import make_policy
from radixmesh.cluster.policy.inflight import InflightTable, Ticket
from radixmesh.cluster.policy.pending_index import PendingHold, PendingIndex
from radixmesh.cluster.policy.step import Routed, RoutingStep
from radixmesh.cluster.router.calibration import Calibration
from radixmesh.cluster.router.config import RouterConfig
from radixmesh.node_agent import VirtualNode, VirtualPull, VirtualStep
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.ids import NodeId
from radixmesh.proto.metadata.messages import MatchResult, NodeMatch
from radixmesh.proto.serve.limits import usable_prefix_blocks
from radixmesh.proto.serve.tokens import SOURCES, TokenSources

SIMULATED_NOTE = ("SIMULATED and MODELED: the engine simulator's virtual time (cluster/bench/engine_sim.py) over the "
                  "profile's time model, not a live cluster nor its hardware")
"""What a simulated bench's JSON says of its engine."""

_STEP, _LAND, _ARRIVE, _GIVE_UP = range(4)
"""Event kinds, in the order they run at equal times: a step's results and a landed pull before an
arrival (the arrival sees them, as it would see a step that ended just before it)."""


@dataclass(slots=True)
class _Request:
    """One bench request while the simulator serves it."""

    bench: BenchRequest
    hashes: tuple[BlockHash, ...]
    node: NodeId | None = None
    routed: Routed | None = None
    routed_s: float = 0.0
    ticket: Ticket | None = None
    hold: PendingHold | None = None
    reused: int = 0
    """Prompt blocks the decision reused (local and pulled), at most the usable ones."""
    pull_s: float | None = None
    """Seconds from routing to its pull's landing (None: no pull)."""
    first_s: float | None = None
    token_s: list[float] = field(default_factory=list)
    outcome: Outcome | None = None


class EngineSim:
    """One cell: `config`'s cluster (the arm's LauncherConfig, a modeled engine) serving `requests`."""

    def __init__(self, config: LauncherConfig, seed: int = 0) -> None:
        if config.modeled is None or not config.local_nodes:
            raise ValueError("the engine simulator runs a modeled engine on --local N nodes")
        if config.prefill_nodes or config.decode_nodes:
            raise ValueError("the engine simulator does not simulate prefill/decode splits")
        self.now = 0.0
        self.nodes = {NodeId(f"node-{i}"): VirtualNode(config.agent_config(NodeId(f"node-{i}"), "", config.host).engine,
                                                       config.modeled, config.model, seed)
                      for i in range(config.local_nodes)}
        first = next(iter(self.nodes.values()))
        self.layout = first.layout
        self.config: RouterConfig = config.router_config(self.layout, first.wire_block_bytes)
        self.block_size = config.block_size
        self.index = GlobalIndex()
        for node in self.nodes:
            self.index.add_node(node, self.layout)
        policy = self.config.policy_config
        rng = random.Random(seed)
        self.table = InflightTable(lambda: self.now, policy.load_half_life_s)
        self.step = RoutingStep(make_policy(self.config.policy, policy, random.Random(rng.random())),
                                PendingIndex(self.config.pending_ttl_s, clock=lambda: self.now,
                                             max_hold_s=self.config.pending_max_s),
                                self.table, block_tokens=self.block_size,
                                default_prefill_tokens_per_s=self.config.default_prefill_tokens_per_s,
                                least_loaded=self.config.least_loaded_candidates)
        self.calibration = Calibration()
        limits = self.config.admission
        self.slots = len(self.nodes) * limits.max_running_per_node
        self.running = 0
        self.waiting: deque[int] = deque()
        self._events: list[tuple[float, int, int, Any]] = []
        self._seq = itertools.count()
        self._requests: list[_Request] = []
        self._stepping: set[NodeId] = set()
        """Nodes whose step is under way (its end is an event)."""
        self.busy_s = dict.fromkeys(self.nodes, 0.0)
        """Seconds each node spent stepping: the load the router balanced (live, no agent reports it)."""
        self.counts = dict.fromkeys(("requests", "prompt_tokens", "regret_tokens", *SOURCES), 0)
        """The router's /stats counters over the requests that arrived in the measured window."""
        self._measured_from = 0.0

    # --- the cell ------------------------------------------------------------------------------
    def run(self, plan: BenchPlan, requests: Sequence[BenchRequest]) -> dict[str, Any]:
        """The cell's figures, as `bench.runner.run_cell` reports a live one (no hand-off, no warm-up)."""
        ramp_s, duration_s, drain_s = plan.ramp_s, plan.duration_s, plan.drain_s
        hasher = next(iter(self.nodes.values()))
        self._measured_from = ramp_s
        for i, r in enumerate(requests):
            self._requests.append(_Request(r, tuple(hasher.hashes(r.prompt))))
            self._push(r.arrival_s, _ARRIVE, i)
        end = ramp_s + duration_s + drain_s
        while self._events and self._events[0][0] <= end:
            t, kind, _, what = heapq.heappop(self._events)
            self.now = t
            if kind == _ARRIVE:
                self._arrive(what)
            elif kind == _GIVE_UP:
                self._give_up(what)
            elif kind == _STEP:
                self._step_done(*what)
            else:
                self._landed(*what)
        self.now = end
        measured = [q for q in self._requests if ramp_s <= q.bench.arrival_s < ramp_s + duration_s]
        results = [self._result(q) for q in self._requests if q.bench.arrival_s >= ramp_s]
        turns = {q.bench.index: q.bench.turn for q in self._requests}
        return {"interrupted": False, "window_s": duration_s,
                "ramp_requests": sum(q.bench.arrival_s < ramp_s for q in self._requests),
                "sessions": count_sessions([q.bench for q in measured]),
                **summarise(results, len(measured), plan.slo, duration_s, self.counts, turns),
                "decisions": self.calibration.report(),
                # Over the whole cell (ramp, window, drain): how evenly the nodes were kept busy.
                "node_busy": sorted(round(b / end, 4) for b in self.busy_s.values()),
                "handoff": {"handoffs": {}, "bytes": 0, "seconds": 0.0, "overlap_seconds": 0.0, "overlap": None}}

    def _result(self, q: _Request) -> RequestResult:
        r = q.bench
        if q.outcome is Outcome.REFUSED:
            return RequestResult(r.index, Outcome.REFUSED)
        gaps = tuple(b - a for a, b in itertools.pairwise(q.token_s))
        if q.outcome is Outcome.OK:
            assert q.first_s is not None
            return RequestResult(r.index, Outcome.OK, q.first_s - r.arrival_s, gaps, q.token_s[-1] - r.arrival_s,
                                 len(q.token_s), q.reused * self.block_size if q.routed else 0)
        if q.first_s is not None:
            return RequestResult(r.index, Outcome.UNFINISHED, q.first_s - r.arrival_s, gaps)
        return RequestResult(r.index, Outcome.UNFINISHED, self.now - r.arrival_s, ttft_censored=True)

    def _push(self, t: float, kind: int, what: Any) -> None:
        heapq.heappush(self._events, (t, kind, next(self._seq), what))

    # --- admission (router.admission.Admission) --------------------------------------------------
    def _arrive(self, i: int) -> None:
        limits = self.config.admission
        if self.running < self.slots:
            self.running += 1
            self._route(i)
        elif len(self.waiting) < limits.max_waiting:
            self.waiting.append(i)
            self._push(self.now + limits.max_wait_s, _GIVE_UP, i)
        else:
            self._requests[i].outcome = Outcome.REFUSED

    def _give_up(self, i: int) -> None:
        if i in self.waiting:
            self.waiting.remove(i)
            self._requests[i].outcome = Outcome.REFUSED

    def _release_slot(self) -> None:
        self.running -= 1
        if self.waiting:
            self.running += 1
            self._route(self.waiting.popleft())

    # --- routing (router.Router.plan and attempts.Attempts.serve) ---------------------------------
    def _route(self, i: int) -> None:
        q = self._requests[i]
        hashes = q.hashes[: self.config.max_match_blocks]
        tokens = len(q.bench.prompt)
        found = self.index.match(self.layout, hashes)
        match = MatchResult(found.cluster_blocks, tuple(
            NodeMatch(n, n, p.gpu, p.host, p.any_tier, self.nodes[n].load()) for n, p in found.prefixes.items()))
        routed = self.step.route(hashes, tokens, match, list(self.nodes), narrow=True,
                                 describe=lambda n: NodeMatch(n, n, 0, 0, 0, self.nodes[n].load()))
        d = routed.decision
        usable = usable_prefix_blocks(tokens, self.block_size)
        pulls = d.pull_from is not None and d.pull_blocks > 0
        q.node, q.routed, q.routed_s, q.hold = d.node, routed, self.now, routed.hold
        q.reused = min(d.local_blocks + d.pull_blocks, usable)
        computed = tokens - q.reused * self.block_size
        q.ticket = self.table.start(d.node, computed, d.pull_s if pulls else 0.0)
        self.table.record_routed(d.node, computed)
        node = self.nodes[d.node]
        pull = node.submit(self.now, str(i), q.bench.prompt, q.bench.max_tokens, q.hashes,
                           min(d.local_blocks + d.pull_blocks, usable) if pulls else 0)
        if pull is not None:
            assert d.pull_from is not None
            wire_s = pull.blocks * node.wire_block_bytes / self.config.policy_config.pull_bytes_per_s
            self._push(self.now + self.config.policy_config.pull_latency_s + wire_s, _LAND, (i, pull, d.pull_from))
        self._kick(d.node)

    def _landed(self, i: int, pull: VirtualPull, peer: NodeId) -> None:
        """What the peer holds of the pulled run now arrives; the rest is computed."""
        q = self._requests[i]
        assert q.node is not None
        held = self.nodes[peer].held_prefix(q.hashes[: pull.start + pull.blocks])
        self.nodes[q.node].land(self.now, pull, max(0, held - pull.start))
        q.pull_s = self.now - q.routed_s
        self._kick(q.node)

    # --- the nodes' steps ----------------------------------------------------------------------
    def _kick(self, node: NodeId) -> None:
        """Start `node`'s next step now, unless one is under way or it has nothing it can run."""
        if node in self._stepping:
            return
        ran = self.nodes[node].step(self.now)
        if ran is not None:
            self._stepping.add(node)
            self.busy_s[node] += ran.seconds
            self._push(self.now + ran.seconds, _STEP, (node, ran))

    def _step_done(self, node: NodeId, ran: VirtualStep) -> None:
        self._stepping.discard(node)
        self.index.apply(node, self.nodes[node].take_events())
        for rid in ran.tokens:
            q = self._requests[int(rid)]
            if rid in ran.sources:
                self._first_token(q, ran.sources[rid])
            q.token_s.append(self.now)
        for rid in ran.finished:
            q = self._requests[int(rid)]
            q.outcome = Outcome.OK
            assert q.ticket is not None
            self.table.finish(q.ticket)
            self._release_slot()
        self._kick(node)

    def _first_token(self, q: _Request, sources: TokenSources) -> None:
        """The router hears of the prefill: pending hold answered, load table and calibration updated."""
        assert q.node is not None and q.routed is not None and q.ticket is not None
        q.first_s = self.now
        if q.hold is not None:
            self.step.answered(q.hold)
        self.table.prefilled(q.ticket)
        d, bs = q.routed.decision, self.block_size
        tokens = len(q.bench.prompt)
        usable = usable_prefix_blocks(tokens, bs)
        longest = max((min(v.local_blocks, usable) for v in q.routed.view.cluster.nodes), default=0)
        pulled = d.pull_from is not None and d.pull_blocks > 0
        self.calibration.add(
            predicted_ttft_s=d.est_ttft_s, realized_ttft_s=self.now - q.bench.arrival_s,
            predicted_pull_s=d.pull_s if pulled else 0.0, realized_pull_s=q.pull_s or 0.0,
            agent_ttft_s=self.now - q.routed_s, predicted_computed=tokens - q.reused * bs,
            realized_computed=sources.computed, left_tokens=max(0, longest - q.reused) * bs,
            bought_s=d.longest_ttft_s - d.est_ttft_s if d.longest_ttft_s is not None else None)
        self.step.move_margin_s = self.calibration.move_margin_s()
        self.step.pull_time_factor = self.calibration.pull_time_factor()
        if q.bench.arrival_s >= self._measured_from:
            hits = tokens - sources.computed
            self.counts["requests"] += 1
            self.counts["prompt_tokens"] += tokens
            self.counts["regret_tokens"] += max(0, min(q.routed.view.cluster_blocks * bs, tokens) - hits)
            for s in SOURCES:
                self.counts[s] += getattr(sources, s)


def simulated_cell(base: LauncherConfig, plan: BenchPlan) -> SimulatedCell:
    """`run_bench`'s cell in the engine simulator: the arm's cluster as LocalClusters would start it."""
    clusters = LocalClusters(base)

    def cell(arm: Arm, rate: float, requests: Sequence[BenchRequest], seed: int) -> dict[str, Any]:
        return EngineSim(clusters.config(arm), seed).run(plan, requests)

    return cell
