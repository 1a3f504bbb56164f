"""The routing step, written once: the router (`Router.plan`), the Ray Serve request router and the
simulator all route through `RoutingStep.route`, so the simulator's figures measure the router's code.

Per request, given the prompt's block hashes and the index's answer for them (a `MatchResult`, or
None without prefix knowledge; the caller asks the index, which may take a round trip): the pending
(speculative) holders of the prefix, the candidates, the view of each candidate (the longer of its
indexed and pending prefix, its load), the policy's decision, and the decision recorded as a pending
hold, which stands until the caller says the node answered (`answered`) or the attempt failed
(`abandon`).

Candidates are either the caller's nodes as given, or (`narrow`) the prefix holders (indexed or
pending) plus the `least_loaded` nodes with the least recent work, with bounded load against the
fleet's mean, so the cost does not grow with the number of nodes.
"""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from radixmesh.cluster.policy.base import RouteDecision, RoutePolicy, RouteRequest
from radixmesh.cluster.policy.pending_index import PendingHold, PendingIndex
from radixmesh.cluster.policy.view import CandidateView, FleetLoad, NodeLoads, build_view
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.ids import NodeId
from radixmesh.proto.metadata.messages import MatchResult, NodeMatch


class NoNodeAvailable(Exception):
    """Every candidate node was unavailable (or there was none): the request could not be served."""


class RecentLoad(NodeLoads, Protocol):
    """The load table a routing step keeps (InflightTable is one): per-node load for the view, the
    least-loaded nodes for narrow candidates, and the fleet's recent work for bounded load."""

    def record_routed(self, node: NodeId, prompt_tokens: int) -> None: ...

    def least_loaded(self, k: int, pool: Sequence[NodeId], usable: Callable[[NodeId], bool]) -> list[NodeId]: ...

    def total_recent_tokens(self) -> float: ...

    def check_invariants(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Routed:
    """One routing step's outcome."""

    decision: RouteDecision
    view: CandidateView
    """What the policy saw, with the candidates' transfer addresses."""
    policy: str
    """The policy that decided (the fallback without an index answer)."""
    match: MatchResult | None
    """The index's answer the view was built from (narrow: the least-loaded candidates added)."""
    hold: PendingHold | None = None
    """The decision's pending record (None when `route` did not record it)."""


def _anyone(node: NodeId) -> bool:
    return True


class RoutingStep:
    """One router's routing state (its pending holders, its load table, its policies) and the step.

    `table` is the router's own load table; `loads` (default `table`) is what the view reads per
    node: the simulator reads queues from its nodes and recent work from `table`.
    """

    def __init__(
        self,
        policy: RoutePolicy,
        pending: PendingIndex,
        table: RecentLoad,
        *,
        block_tokens: int,
        default_prefill_tokens_per_s: float,
        least_loaded: int = 0,
        fallback: RoutePolicy | None = None,
        loads: NodeLoads | None = None,
    ) -> None:
        self.policy = policy
        self.fallback = fallback or policy
        """Decides when there is no index answer (the router's degraded mode)."""
        self.pending = pending
        self.table = table
        self.loads: NodeLoads = loads or table
        self.block_tokens = block_tokens
        self.default_prefill_tokens_per_s = default_prefill_tokens_per_s
        self.least_loaded = least_loaded
        """Narrow candidates: how many least-loaded nodes join the prefix holders."""
        self.move_margin_s = 0.0
        """ClusterView.move_margin_s of the next decisions: the router sets it from its calibration (Calibration.tune)."""
        self.pull_time_factor = 1.0
        """ClusterView.pull_time_factor of the next decisions: likewise."""
        self.wait_time_factor = 1.0
        """ClusterView.wait_time_factor of the next decisions: likewise."""

    def route(
        self,
        hashes: Sequence[BlockHash],
        prompt_tokens: int,
        match: MatchResult | None,
        pool: Sequence[NodeId],
        *,
        narrow: bool = False,
        exclude: frozenset[NodeId] = frozenset(),
        usable: Callable[[NodeId], bool] = _anyone,
        describe: Callable[[NodeId], NodeMatch | None] | None = None,
        pin: NodeId | None = None,
        record: bool = True,
        peers: frozenset[NodeId] = frozenset(),
    ) -> Routed:
        """Decide where a prompt of `prompt_tokens` tokens whose full blocks are `hashes` goes, never to
        a node of `exclude`, and (`record`) hold the decision as pending until `answered` or `abandon`.

        Candidates: `pool` as given, or with `narrow` (and an index answer) the holders and the
        least-loaded nodes of `pool` that pass `usable` (all of `pool` when none does), with what
        `describe` knows of the least-loaded ones (their heartbeated load and transfer address) added
        to `match`. `pin`, while a candidate, is the only one. `peers` are never candidates; those of
        them that hold a computed prefix (and are not excluded) join the view as pull peers
        (ClusterView.peers). Raises NoNodeAvailable when no candidate is left.
        """
        pending = self.pending.match(hashes)
        computed = self.pending.match(hashes, computed=True)
        fleet: FleetLoad | None = None
        if narrow and match is not None:
            match, candidates, fleet = self._narrow(match, pending, pool, exclude | peers, usable, describe)
        else:
            barred = exclude | peers
            candidates = [n for n in pool if n not in barred] if barred else list(pool)
        if pin is not None and pin in candidates:
            candidates = [pin]
        if not candidates:
            raise NoNodeAvailable("no candidate node left")
        holders = {m.node_id for m in match.nodes if m.gpu_blocks} if match is not None else set()
        lenders = sorted(n for n in peers if n not in exclude and (n in holders or computed.get(n, 0)))
        view = build_view([*candidates, *lenders], match, pending, self.loads, self.default_prefill_tokens_per_s,
                          fleet, computed=computed, move_margin_s=self.move_margin_s,
                          pull_time_factor=self.pull_time_factor, wait_time_factor=self.wait_time_factor)
        if lenders:
            nodes = view.cluster.nodes
            view = replace(view, cluster=replace(view.cluster, nodes=nodes[: len(candidates)],
                                                 peers=nodes[len(candidates):]))
        policy = self.policy if match is not None else self.fallback
        decision = policy.route(RouteRequest(prompt_tokens, len(hashes), self.block_tokens), view.cluster)
        hold = self.pending.hold(decision.node, hashes) if record else None
        return Routed(decision, view, policy.name, match, hold)

    def computed(self, node: NodeId, hashes: Sequence[BlockHash]) -> None:
        """`node` answered a request for these blocks with its first token: pullable from it now."""
        self.pending.computed(node, hashes)

    def answered(self, hold: PendingHold) -> None:
        """`hold`'s node answered its request with a first token: its blocks are pullable from it now,
        and the hold ends once the node's events had time to reach the index (PendingIndex.ttl_s)."""
        self.pending.computed(hold.node, hold.hashes)
        self.pending.release(hold)

    def abandon(self, hold: PendingHold) -> None:
        """`hold`'s attempt failed or was given up: its node will not hold those blocks for it."""
        self.pending.release(hold, failed=True)

    def record(self, node: NodeId, hashes: Sequence[BlockHash], prompt_tokens: int) -> None:
        """`node` was sent the prompt (when `route` did not record it), with no answer to wait for:
        pending holder for PendingIndex.ttl_s, and recent work."""
        self.pending.add(node, hashes)
        self.table.record_routed(node, prompt_tokens)

    def _narrow(
        self,
        match: MatchResult,
        pending: Mapping[NodeId, int],
        pool: Sequence[NodeId],
        exclude: frozenset[NodeId],
        usable: Callable[[NodeId], bool],
        describe: Callable[[NodeId], NodeMatch | None] | None,
    ) -> tuple[MatchResult, list[NodeId], FleetLoad]:
        """The prefix holders (indexed or pending) and the least-loaded nodes of `pool`, usable ones."""

        def ok(n: NodeId) -> bool:
            return n not in exclude and usable(n)

        chosen = dict.fromkeys(n for n in (*(m.node_id for m in match.nodes), *pending) if ok(n))
        extra = []
        for n in self.table.least_loaded(self.least_loaded, pool, ok):
            if n not in chosen:
                chosen[n] = None
                described = describe(n) if describe is not None else None
                if described is not None:
                    extra.append(described)
        candidates = list(chosen)
        if not candidates:  # agents that never registered (standalone) are served rather than refused
            candidates = [n for n in pool if n not in exclude]
        fleet = FleetLoad(len(pool), self.table.total_recent_tokens())
        if extra:
            match = MatchResult(match.cluster_blocks, match.nodes + tuple(extra))
        return match, candidates, fleet
