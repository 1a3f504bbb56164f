"""The `cost` policy: the node with the lowest estimated TTFT under bounded load.

Each candidate may pull the blocks the best other holder has computed beyond its own prefix (never
blocks a holder is still computing: that pull would get nothing); `cost_no_pull` is the same policy
with the null pull source, to measure what pulling adds.

Scores add two prices to the TTFT (cost_model), both for work a node does that another candidate
would not: prefilling blocks another node is already computing for an earlier request (a pending
prefix), and the delay to others of the extra work (`cost_model.delay_to_others`). A candidate that
would leave part of the longest cached prefix behind is also charged the view's `move_margin_s`: the
router's recent 90th-percentile TTFT error times sqrt(2) (the spread of a difference of two
estimates), so a move must buy more than the estimates' own noise.
Why each price: docs/routing.md#the-cost-model.
"""

import random
from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol

from radixmesh.cluster.policy.base import PolicyConfig, RouteDecision, RouteRequest, register, within_load_cap
from radixmesh.cluster.policy.cost_model import CostModel, Holder, TTFTEstimate, delay_to_others
from radixmesh.cluster.policy.view import ClusterView, NodeView
from radixmesh.proto.ids import NodeId


class PullSource(Protocol):
    def prepare(self, cluster: ClusterView) -> None:
        """Called once per decision before `holder`."""

    def holder(self, candidate: NodeView, cluster: ClusterView) -> Holder | None:
        """The peer `candidate` would pull from, or None."""


def _top_two(nodes: Sequence[NodeView], blocks: Callable[[NodeView], int]) -> list[NodeView]:
    """The two of `nodes` with the most `blocks` (> 0), most first; ties: first in the view."""
    top: list[NodeView] = []
    for v in nodes:
        n = blocks(v)
        if n == 0:
            continue
        if len(top) < 2 or n > blocks(top[1]):
            top.append(v)
            top.sort(key=lambda t: -blocks(t))
            del top[2:]
    return top


def _best_other(top: Sequence[NodeView], node: NodeId) -> NodeView | None:
    return next((v for v in top if v.node != node), None)


class LongestPeer:
    """The other node that has computed the longest prefix (ties: first in the view). Keeps the top
    two so each candidate's best peer costs O(1), not O(nodes)."""

    def __init__(self) -> None:
        self._top: list[NodeView] = []

    def prepare(self, cluster: ClusterView) -> None:
        # Peers are pulled from like candidates; they are only never chosen.
        self._top = _top_two((*cluster.nodes, *cluster.peers), lambda v: v.held_blocks)

    def holder(self, candidate: NodeView, cluster: ClusterView) -> Holder | None:
        v = _best_other(self._top, candidate.node)
        if v is None:
            return None
        pair = (candidate.node, v.node)
        return Holder(v.node, v.held_blocks, cluster.pull_bytes_per_s.get(pair), cluster.pull_latency_s.get(pair),
                      cluster.pull_time_factor)


class NoPulls:
    """Null pull source: every candidate computes what it does not hold."""

    def prepare(self, cluster: ClusterView) -> None:
        return None

    def holder(self, candidate: NodeView, cluster: ClusterView) -> Holder | None:
        return None


class _Plan(NamedTuple):
    """What a candidate would do for the request, apart from its node's prefill rate."""

    tokens: int
    """Prompt tokens it prefills."""
    swap_s: float
    pull_s: float


def _extra_work(est: TTFTEstimate, v: NodeView, plans: set[_Plan]) -> tuple[float, float]:
    """(work, compute) seconds `v` does beyond the least any candidate's plan would take on `v`
    itself: what it recomputes, reads from a tier or pulls that another candidate would not.

    Each plan is priced at `v`'s own prefill rate, so nodes that would do the same thing have no
    extra work whatever their measured rates. Compared in seconds across nodes (each plan at its own
    node's rate), the rates' measurement noise became extra work: on the agent workload past the
    knee (8 modeled H100 agents at 0.01x, 33.75 req/s) sessions' first calls, equal on every node
    holding the tool preamble, were charged 2-5 ms of "extra" work times n (n + 1) for 25-55 queued
    requests, 10-20 s of others' waiting that outweighed the queues themselves: `cost` put new
    sessions 20 to 57 per node where prefix affinity put 35-41, and its busiest nodes' queues grew
    to 55-74 waiting against affinity's 24-45 (docs/routing.md#the-cost-model)."""
    rate = v.prefill_tokens_per_s
    least = min(p.tokens / rate + p.swap_s + p.pull_s for p in plans)
    least_compute = min(p.tokens / rate + p.swap_s for p in plans)
    compute = est.prefill_s + est.swap_s
    return max(0.0, compute + est.pull_s - least), max(0.0, compute - least_compute)


class _Scored(NamedTuple):
    own_s: float
    """Estimated TTFT plus duplicate prefill."""
    est: TTFTEstimate
    view: NodeView
    holder: Holder | None
    duplicate: int
    extra_s: float
    """Work beyond the cheapest candidate's."""
    delay_s: float
    """What `extra_s` costs the requests queued behind it and those decoding there (delay_to_others)."""
    margin_s: float
    """The view's move margin when this candidate leaves cached blocks behind, else 0."""

    @property
    def score(self) -> float:
        return self.own_s + self.delay_s + self.margin_s


def _delay(s: _Scored) -> str:
    return (f"priced {s.delay_s * 1e3:.1f} ms of others' waiting ({s.view.queued_requests} queued, "
            f"{s.view.running_decodes} decoding)")


class CostPolicy:
    """argmin over nodes within the load cap of estimated TTFT plus duplicate prefill plus the delay
    its extra work causes others; scores within the view's move margin of the least are ties, which
    go to a node keeping the cached prefix, then to fewer waiting, then to fewer in flight, then random."""

    def __init__(self, config: PolicyConfig, rng: random.Random, pulls: PullSource, name: str) -> None:
        self.name = name
        self._model = CostModel(config)
        self._eps = config.load_eps
        self._floor_s = config.load_floor_s
        self._rng = rng
        self._pulls = pulls

    def route(self, request: RouteRequest, cluster: ClusterView) -> RouteDecision:
        self._pulls.prepare(cluster)
        computing = _top_two(cluster.nodes, lambda v: v.pending_blocks)
        mates = self._model.mates_work(cluster.nodes)
        priced = []
        plans: set[_Plan] = set()
        for v in within_load_cap(cluster.nodes, self._eps, request, self._floor_s, cluster.fleet):
            holder = self._pulls.holder(v, cluster)
            est = self._model.estimate(request, v, holder, mates(v))
            other = _best_other(computing, v.node)
            covered = min(v.local_blocks, request.num_blocks) + est.pull_blocks
            duplicate = max(0, min(other.pending_blocks, request.num_blocks) - covered) if other else 0
            own = est.total_s + duplicate * request.block_tokens / v.prefill_tokens_per_s
            priced.append((own, est, v, holder, duplicate))
            plans.add(_Plan(request.prompt_tokens - covered * request.block_tokens, est.swap_s, est.pull_s))
        longest = max(min(p[2].local_blocks, request.num_blocks) for p in priced)

        def leaves(est: TTFTEstimate, v: NodeView) -> bool:
            return min(v.local_blocks, request.num_blocks) + est.pull_blocks < longest

        def margin(est: TTFTEstimate, v: NodeView) -> float:
            return cluster.move_margin_s if leaves(est, v) else 0.0

        def scored_one(own: float, est: TTFTEstimate, v: NodeView, holder: Holder | None, duplicate: int) -> _Scored:
            extra, extra_compute = _extra_work(est, v, plans)
            return _Scored(own, est, v, holder, duplicate, extra, delay_to_others(v, extra, extra_compute),
                           margin(est, v))

        scored = [scored_one(*p) for p in priced]
        # Scores within the margin of the best are not told apart (the estimates' own error): among
        # them, keeping what is cached first, the fewest requests waiting for their prefill win, then
        # the fewest in flight. Ranked by score alone, docs requests whose holders all looked alike
        # herded onto whichever's measured step floor lagged lowest: its decode batch grew, every step
        # there slowed, and past the knee cost served 0.85x prefix affinity's goodput at equal hit
        # rates. Ranked by in flight alone, past the knee (where the margin, 1.4x the TTFT error's
        # p90, ties nearly every candidate) new agent sessions went to nodes with few decodes but long
        # prefill queues: 0.80-0.97x affinity's goodput at 33.75 req/s on 8 modeled H100 agents,
        # 0.99-1.00x with the waiting first (docs kept 1.22x; docs/routing.md#the-cost-model).
        # (The relative slack keeps scores equal but for float rounding together.)
        limit = (min(s.score for s in scored) + cluster.move_margin_s) * (1 + 1e-9)
        near = [s for s in scored if s.score <= limit]
        ranked = [((leaves(s.est, s.view), s.view.queued_requests, s.view.inflight, s.score), s)
                  for s in near]
        best = min(rank for rank, _ in ranked)
        tied = [s for rank, s in ranked if rank == best]
        pick = tied[0] if len(tied) == 1 else self._rng.choice(tied)
        est, view, holder = pick.est, pick.view, pick.holder
        local = min(view.local_blocks, request.num_blocks)
        peer = holder.node if holder is not None and est.pull_blocks else None
        reason = f"ttft {est.total_s * 1e3:.1f} ms: {local} local"
        if peer is not None:
            reason += f", {est.pull_blocks} pulled from {peer} in {est.pull_s * 1e3:.1f} ms"
        reason += f", queue {est.queue_s * 1e3:.1f} ms"
        if est.shared_s:
            reason += f", {est.shared_s * 1e3:.1f} ms to cores shared"
        if pick.duplicate:
            reason += f", {pick.duplicate} blocks another node is computing"
        if pick.extra_s:
            reason += f", {pick.extra_s * 1e3:.1f} ms more work than the least, {_delay(pick)}"
        # The node its own TTFT alone would have picked, when the delay to others kept the request away.
        faster = min(scored, key=lambda s: s.own_s)
        if faster.own_s < pick.own_s:
            reason += (f"; not {faster.view.node} (ttft {faster.est.total_s * 1e3:.1f} ms): "
                       f"{faster.extra_s * 1e3:.1f} ms more work there, {_delay(faster)}")
        if pick.margin_s:
            reason += f", beat the longest prefix by more than the {pick.margin_s * 1e3:.1f} ms margin"
        holder_of_longest = max(scored, key=lambda s: min(s.view.local_blocks, request.num_blocks))
        return RouteDecision(view.node, local, peer, est.pull_blocks, est.total_s, reason, est.pull_s,
                             holder_of_longest.est.total_s if local + est.pull_blocks < longest else None)


@register("cost")
def _cost(config: PolicyConfig, rng: random.Random) -> CostPolicy:
    return CostPolicy(config, rng, LongestPeer(), "cost")


@register("cost_no_pull")
def _cost_no_pull(config: PolicyConfig, rng: random.Random) -> CostPolicy:
    return CostPolicy(config, rng, NoPulls(), "cost_no_pull")
