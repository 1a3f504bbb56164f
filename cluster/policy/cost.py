"""The `cost` policy: the node with the lowest estimated TTFT under bounded load.

Each candidate may pull the blocks the best other holder has beyond its own prefix; `cost_no_pull`
is the same policy with the null pull source, to measure what pulling adds.
"""

import random
from typing import Protocol

from radixmesh.cluster.policy.base import PolicyConfig, RouteDecision, RouteRequest, register, within_load_cap
from radixmesh.cluster.policy.cost_model import CostModel, Holder
from radixmesh.cluster.policy.view import ClusterView, NodeView


class PullSource(Protocol):
    def prepare(self, cluster: ClusterView) -> None:
        """Called once per decision before `holder`."""

    def holder(self, candidate: NodeView, cluster: ClusterView) -> Holder | None:
        """The peer `candidate` would pull from, or None."""


class LongestPeer:
    """The other node holding the longest prefix (ties: first in the view). Keeps the top two
    holders so each candidate's best peer costs O(1), not O(nodes)."""

    def __init__(self) -> None:
        self._top: list[NodeView] = []

    def prepare(self, cluster: ClusterView) -> None:
        top: list[NodeView] = []
        for v in cluster.nodes:
            if v.local_blocks == 0:
                continue
            if len(top) < 2 or v.local_blocks > top[1].local_blocks:
                top.append(v)
                top.sort(key=lambda t: -t.local_blocks)
                del top[2:]
        self._top = top

    def holder(self, candidate: NodeView, cluster: ClusterView) -> Holder | None:
        for v in self._top:
            if v.node != candidate.node:
                return Holder(v.node, v.local_blocks, cluster.bandwidth(candidate.node, v.node))
        return None


class NoPulls:
    """Null pull source: every candidate computes what it does not hold."""

    def prepare(self, cluster: ClusterView) -> None:
        return None

    def holder(self, candidate: NodeView, cluster: ClusterView) -> Holder | None:
        return None


class CostPolicy:
    """argmin over nodes within the load cap of estimated TTFT; ties go to fewer in flight, then random."""

    def __init__(self, config: PolicyConfig, rng: random.Random, pulls: PullSource, name: str) -> None:
        self.name = name
        self._model = CostModel(config)
        self._eps = config.load_eps
        self._floor_s = config.load_floor_s
        self._rng = rng
        self._pulls = pulls

    def route(self, request: RouteRequest, cluster: ClusterView) -> RouteDecision:
        self._pulls.prepare(cluster)
        scored = []
        for v in within_load_cap(cluster.nodes, self._eps, request.prompt_tokens, self._floor_s, cluster.fleet):
            holder = self._pulls.holder(v, cluster)
            scored.append((self._model.estimate(request, v, holder), v, holder))
        best = min((est.total_s, v.inflight) for est, v, _ in scored)
        tied = [s for s in scored if (s[0].total_s, s[1].inflight) == best]
        est, view, holder = tied[0] if len(tied) == 1 else self._rng.choice(tied)
        local = min(view.local_blocks, request.num_blocks)
        peer = holder.node if holder is not None and est.pull_blocks else None
        reason = f"ttft {est.total_s * 1e3:.1f} ms: {local} local"
        if peer is not None:
            reason += f", {est.pull_blocks} pulled from {peer}"
        reason += f", queue {est.queue_s * 1e3:.1f} ms"
        return RouteDecision(view.node, local, peer, est.pull_blocks, est.total_s, reason)


@register("cost")
def _cost(config: PolicyConfig, rng: random.Random) -> CostPolicy:
    return CostPolicy(config, rng, LongestPeer(), "cost")


@register("cost_no_pull")
def _cost_no_pull(config: PolicyConfig, rng: random.Random) -> CostPolicy:
    return CostPolicy(config, rng, NoPulls(), "cost_no_pull")
