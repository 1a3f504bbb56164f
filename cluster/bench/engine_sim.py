"""The engine simulator: a bench cell of a modeled cluster replayed in virtual time, with the production
code everywhere but the network, so it ranks routers as the live modeled cluster does, in seconds and
without the host's cores in the figures (`radixmesh bench --local N --engine modeled:P --simulate`).

As live: each node is the agent's own Engine over the modeled forward on a virtual clock (node_agent's
VirtualNode), heartbeating its StepRates; the router's routing step, policy, pending holders, load
table, calibration and admission run on the RouterConfig the launcher builds; pulls are the engine's
pending prefixes, landed after the pull latency and wire time the router prices, with what the peer
still holds then; split arms run as Disaggregation serves them (the prefill phase routed among the
prefill agents as a prefill-only request, the decode phase on the decode agent with the fewest in
flight then the most free blocks, a turn a decode agent holds served there whole).

Not as live: the index learns a node's blocks at the end of the step that made them (live: the next
publish, 50 ms, and the replica's lag); a pull moves no bytes, never fails and takes exactly its
price; a peer still prefilling a pulled prefix sends only what it has cached; a streamed hand-off
lands its last chunk's wire time after the prefill ends; no warm-up. docs/benchmarks.md has the
fidelity figures.
"""

import collections
import heapq
import itertools
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from radixmesh.cluster.bench.arms import Arm, LocalClusters
from radixmesh.cluster.bench.client import Outcome, RequestResult
from radixmesh.cluster.bench.metrics import summarise
from radixmesh.cluster.bench.runner import BenchPlan, SimulatedCell
from radixmesh.cluster.bench.schedule import BenchRequest, count_sessions
from radixmesh.cluster.bench.sim_admission import SimAdmission
from radixmesh.cluster.launch.config import LauncherConfig
from radixmesh.cluster.metadata.index import GlobalIndex
from radixmesh.cluster.policy.base import make_policy
from radixmesh.cluster.policy.inflight import InflightTable, Ticket
from radixmesh.cluster.policy.pending_index import PendingIndex
from radixmesh.cluster.policy.step import Routed, RoutingStep
from radixmesh.cluster.router.calibration import Calibration
from radixmesh.cluster.router.config import RouterConfig
from radixmesh.cluster.router.disaggregation import local_holder, overlap_s
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
PREFILL = "/prefill"
"""A split request's prefill phase's id: its request's index and this."""


@dataclass(slots=True)
class _Phase:
    """One attempt of a request on one node: the whole request, or a split request's prefill or decode."""

    node: NodeId
    ticket: Ticket
    began_s: float
    routed: Routed | None = None
    """The policy's decision (none for a decode phase: DecodePicker prices nothing)."""
    reused: int = 0
    """Prompt blocks it reuses (local and pulled), at most the usable ones."""
    pull: VirtualPull | None = None
    pull_from: NodeId | None = None
    pull_s: float | None = None
    """Seconds from its start to its pull's landing (None: no pull landed)."""
    received: int = 0
    """Blocks its pull landed."""


@dataclass(slots=True)
class _Request:
    """One bench request while the simulator serves it."""

    bench: BenchRequest
    hashes: tuple[BlockHash, ...]
    serve: _Phase | None = None
    """The phase that gives the client its tokens: the whole request, or a split request's decode."""
    prefill: _Phase | None = None
    """A split request's prefill phase."""
    prefilled_s: float | None = None
    first_s: float | None = None
    token_s: list[float] = field(default_factory=list)
    outcome: Outcome | None = None


class EngineSim:
    """One cell: `config`'s cluster (the arm's LauncherConfig, a modeled engine) serving `requests`."""

    def __init__(self, config: LauncherConfig, seed: int = 0) -> None:
        if config.modeled is None or not config.local_nodes:
            raise ValueError("the engine simulator runs a modeled engine on --local N nodes")
        self.now = 0.0
        ids = config.node_ids(config.local_nodes)
        self.nodes = {n: VirtualNode(config.agent_config(n, "", config.host).engine, config.modeled, config.model, seed)
                      for n in ids}
        self.prefill_nodes = [n for n in ids if config.role_of(n) == "prefill"]
        self.decode_nodes = [n for n in ids if config.role_of(n) == "decode"]
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
        self.admission = SimAdmission(self.config.admission, len(self.nodes))
        self._events: list[tuple[float, int, int, Any]] = []
        self._seq = itertools.count()
        self._requests: list[_Request] = []
        self._stepping: set[NodeId] = set()
        """Nodes whose step is under way (its end is an event)."""
        self.busy_s = dict.fromkeys(self.nodes, 0.0)
        """Seconds each node spent stepping: the load the router balanced (live, no agent reports it)."""
        self.counts = dict.fromkeys(("requests", "prompt_tokens", "regret_tokens", *SOURCES), 0)
        """The router's /stats counters over the requests that arrived in the measured window."""
        self.handoffs: collections.Counter[str] = collections.Counter()
        self.handoff = {"bytes": 0, "seconds": 0.0, "overlap_seconds": 0.0}
        """The hand-offs of the requests that arrived in the measured window (the router's counters)."""
        self._measured_from = 0.0
        self._hand_off_pulls = config.handoff
        """Holders demote what a delivered pull took (LauncherConfig.handoff), as the agents' transfer
        sources do."""

    # --- the cell ------------------------------------------------------------------------------
    def run(self, plan: BenchPlan, requests: Sequence[BenchRequest]) -> dict[str, Any]:
        """The cell's figures, as `bench.runner.run_cell` reports a live one (no warm-up)."""
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
        moved = self.handoff["seconds"]
        return {"interrupted": False, "window_s": duration_s,
                "ramp_requests": sum(q.bench.arrival_s < ramp_s for q in self._requests),
                "sessions": count_sessions([q.bench for q in measured]),
                **summarise(results, len(measured), plan.slo, duration_s, self.counts, turns),
                "decisions": self.calibration.report(),
                # Over the whole cell (ramp, window, drain): how evenly the nodes were kept busy.
                "node_busy": sorted(round(b / end, 4) for b in self.busy_s.values()),
                "handoff": {"handoffs": dict(self.handoffs), **self.handoff,
                            "overlap": round(self.handoff["overlap_seconds"] / moved, 4) if moved else None}}

    def _result(self, q: _Request) -> RequestResult:
        r = q.bench
        if q.outcome is Outcome.REFUSED:
            return RequestResult(r.index, Outcome.REFUSED)
        gaps = tuple(b - a for a, b in itertools.pairwise(q.token_s))
        if q.outcome is Outcome.OK:
            assert q.first_s is not None and q.serve is not None
            return RequestResult(r.index, Outcome.OK, q.first_s - r.arrival_s, gaps, q.token_s[-1] - r.arrival_s,
                                 len(q.token_s), (q.prefill or q.serve).reused * self.block_size)
        if q.first_s is not None:
            return RequestResult(r.index, Outcome.UNFINISHED, q.first_s - r.arrival_s, gaps)
        return RequestResult(r.index, Outcome.UNFINISHED, self.now - r.arrival_s, ttft_censored=True)

    def _push(self, t: float, kind: int, what: Any) -> None:
        heapq.heappush(self._events, (t, kind, next(self._seq), what))

    def _measured(self, q: _Request) -> bool:
        return q.bench.arrival_s >= self._measured_from

    # --- admission --------------------------------------------------------------------------------
    def _arrive(self, i: int) -> None:
        admitted = self.admission.arrive(i)
        if admitted:
            self._route(i)
        elif admitted is None:
            self._push(self.now + self.config.admission.max_wait_s, _GIVE_UP, i)
        else:
            self._requests[i].outcome = Outcome.REFUSED

    def _give_up(self, i: int) -> None:
        if self.admission.give_up(i):
            self._requests[i].outcome = Outcome.REFUSED

    def _release_slot(self) -> None:
        following = self.admission.release()
        if following is not None:
            self._route(following)

    # --- routing (router.Router.plan, attempts.Attempts.serve, disaggregation.Disaggregation) -------
    def _route(self, i: int) -> None:
        q = self._requests[i]
        hashes = q.hashes[: self.config.max_match_blocks]
        tokens = len(q.bench.prompt)
        found = self.index.match(self.layout, hashes)
        match = MatchResult(found.cluster_blocks, tuple(
            NodeMatch(n, n, p.gpu, p.host, p.any_tier, self.nodes[n].load()) for n, p in found.prefixes.items()))

        def route(pool: Sequence[NodeId], pin: NodeId | None = None, peers: frozenset[NodeId] = frozenset()) -> Routed:
            return self.step.route(hashes, tokens, match, pool, narrow=True, pin=pin, peers=peers,
                                   describe=lambda n: NodeMatch(n, n, 0, 0, 0, self.nodes[n].load()))

        if not self.prefill_nodes:
            q.serve = self._start(i, route(list(self.nodes)))
            return
        holder = local_holder(match, frozenset(self.decode_nodes), tokens, self.block_size,
                              self.config.local_prefill_max_tokens)
        if holder is not None:  # a turn the decode agent holds: served there whole (Router._plan_local)
            q.serve = self._start(i, route(self.decode_nodes, pin=holder))
            return
        q.prefill = self._start(i, route(list(self.nodes), peers=frozenset(self.decode_nodes)), prefill_only=True)
        if self.config.stream_handoff:  # the decode phase follows the prefill from its start
            self._decode(i)

    def _start(self, i: int, routed: Routed, prefill_only: bool = False) -> _Phase:
        """Send request `i` (or its prefill) where `routed` says, with the pull it plans."""
        q, d = self._requests[i], routed.decision
        tokens = len(q.bench.prompt)
        usable = usable_prefix_blocks(tokens, self.block_size)
        pulls = d.pull_from is not None and d.pull_blocks > 0
        reused = min(d.local_blocks + d.pull_blocks, usable)
        computed = tokens - reused * self.block_size
        ticket = self.table.start(d.node, computed, d.pull_s if pulls else 0.0)
        self.table.record_routed(d.node, computed)
        phase = _Phase(d.node, ticket, self.now, routed, reused, pull_from=d.pull_from if pulls else None)
        node = self.nodes[d.node]
        phase.pull = node.submit(self.now, f"{i}{PREFILL}" if prefill_only else str(i), q.bench.prompt,
                                 q.bench.max_tokens, q.hashes, reused if pulls else 0, prefill_only=prefill_only)
        if phase.pull is not None:
            self._push(self.now + self._pull_s(phase.pull.blocks), _LAND, (i, phase))
        self._kick(d.node)
        return phase

    def _decode(self, i: int) -> None:
        """A split request's decode phase (DecodePicker): the decode agent with the fewest requests in
        flight, then the most free blocks, pulls the prompt's usable blocks from the prefill agent."""
        q = self._requests[i]
        assert q.prefill is not None
        node = min(self.decode_nodes, key=lambda n: (self.table.inflight(n), -self.nodes[n].load().free_blocks, n))
        tokens = len(q.bench.prompt)
        usable = usable_prefix_blocks(tokens, self.block_size)
        ticket = self.table.start(node, tokens - usable * self.block_size)
        q.serve = phase = _Phase(node, ticket, self.now, reused=usable, pull_from=q.prefill.node)
        phase.pull = self.nodes[node].submit(self.now, str(i), q.bench.prompt, q.bench.max_tokens, q.hashes, usable)
        if q.prefilled_s is not None:
            self._hand_off(i)
        self._kick(node)

    def _hand_off(self, i: int) -> None:
        """The prefill ended: the decode phase's pull lands after what of it the prefill did not
        overlap (streamed: the last chunk's blocks; after the prefill: all of them)."""
        q = self._requests[i]
        assert q.serve is not None
        pull = q.serve.pull
        if pull is None:
            return
        followed = self.config.stream_handoff and q.serve.began_s < (q.prefilled_s or 0.0)
        assert q.prefill is not None
        chunk = self.nodes[q.prefill.node].engine.config.max_num_batched_tokens // self.block_size
        self._push(self.now + self._pull_s(min(pull.blocks, chunk) if followed else pull.blocks), _LAND, (i, q.serve))

    def _pull_s(self, blocks: int) -> float:
        """A pull's time at the router's prices: its latency, then the profile's wire time."""
        policy = self.config.policy_config
        return policy.pull_latency_s + blocks * next(iter(self.nodes.values())).wire_block_bytes / policy.pull_bytes_per_s

    def _landed(self, i: int, phase: _Phase) -> None:
        """What the peer holds of the pulled run now arrives; the rest is computed."""
        q, pull = self._requests[i], phase.pull
        assert pull is not None and phase.pull_from is not None
        held = self.nodes[phase.pull_from].held_prefix(q.hashes[: pull.start + pull.blocks])
        phase.received = max(0, held - pull.start)
        self.nodes[phase.node].land(self.now, pull, phase.received)
        if self._hand_off_pulls and phase.received:
            self.nodes[phase.pull_from].hand_off(q.hashes[pull.start : pull.start + phase.received])
        phase.pull_s = self.now - phase.began_s
        if phase is q.serve and q.prefill is not None and self._measured(q):
            node = self.nodes[phase.node]
            self.handoffs["pulled" if phase.received == pull.blocks else "partial" if phase.received else "recomputed"] += 1
            self.handoff["bytes"] += phase.received * node.wire_block_bytes
            self.handoff["seconds"] += phase.pull_s
            self.handoff["overlap_seconds"] += overlap_s(phase.began_s, q.prefilled_s, self.now, phase.pull_s)
        self._kick(phase.node)

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
            if rid.endswith(PREFILL):
                self._prefilled(int(rid.removesuffix(PREFILL)), ran.sources[rid])
                continue
            q = self._requests[int(rid)]
            q.outcome = Outcome.OK
            assert q.serve is not None
            self.table.finish(q.serve.ticket)
            self._release_slot()
        self._kick(node)

    def _first_token(self, q: _Request, sources: TokenSources) -> None:
        """The client's first token: the router hears of its prefill (a whole request's: its hold
        answered and its decision priced; a decode phase's: its load only)."""
        assert q.serve is not None
        q.first_s = self.now
        self.table.prefilled(q.serve.ticket)
        if q.prefill is None:
            self._priced(q, q.serve, sources)

    def _prefilled(self, i: int, sources: TokenSources) -> None:
        """A split request's prefill phase ended (PREFILLED): it is priced, and its KV handed off."""
        q = self._requests[i]
        assert q.prefill is not None
        q.prefilled_s = self.now
        self.table.finish(q.prefill.ticket)
        self._priced(q, q.prefill, sources)
        if q.serve is None:  # the hand-off begins once the prefill has ended
            self._decode(i)
        else:
            self._hand_off(i)

    def _priced(self, q: _Request, phase: _Phase, sources: TokenSources) -> None:
        """A routed phase answered: its pending hold ends, and its decision's prediction meets what
        happened (calibration: the next decisions' move margin and pull time factor); its tokens count.
        Its TTFT counts from its routing, as Attempts.serve's does: the wait for admission before it
        is no price the decision set (counted from the arrival, past the knee the move margin grew
        with the admission queue, which the live router never saw)."""
        routed = phase.routed
        assert routed is not None
        if routed.hold is not None:
            self.step.answered(routed.hold)
        d, bs = routed.decision, self.block_size
        tokens = len(q.bench.prompt)
        usable = usable_prefix_blocks(tokens, bs)
        longest = max((min(v.local_blocks, usable) for v in routed.view.cluster.nodes), default=0)
        ttft = self.now - phase.began_s  # the router's and the agent's alike: no hop between them here
        self.calibration.add(
            predicted_ttft_s=d.est_ttft_s, realized_ttft_s=ttft,
            predicted_pull_s=d.pull_s if phase.pull_from is not None else 0.0, realized_pull_s=phase.pull_s or 0.0,
            pull_time_factor=routed.view.cluster.pull_time_factor, wait_time_factor=routed.view.cluster.wait_time_factor,
            agent_ttft_s=ttft, predicted_computed=tokens - phase.reused * bs,
            realized_computed=sources.computed, left_tokens=max(0, longest - phase.reused) * bs,
            bought_s=d.longest_ttft_s - d.est_ttft_s if d.longest_ttft_s is not None else None)
        self.calibration.tune(self.step)
        if self._measured(q):
            hits = tokens - sources.computed
            self.counts["requests"] += 1
            self.counts["prompt_tokens"] += tokens
            self.counts["regret_tokens"] += max(0, min(routed.view.cluster_blocks * bs, tokens) - hits)
            for s in SOURCES:
                self.counts[s] += getattr(sources, s)


def simulated_cell(base: LauncherConfig, plan: BenchPlan) -> SimulatedCell:
    """`run_bench`'s cell in the engine simulator: the arm's cluster as LocalClusters would start it."""
    clusters = LocalClusters(base)

    def cell(arm: Arm, rate: float, requests: Sequence[BenchRequest], seed: int) -> dict[str, Any]:
        return EngineSim(clusters.config(arm), seed).run(plan, requests)

    return cell
