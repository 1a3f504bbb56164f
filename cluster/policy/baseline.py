"""Baseline policies kept selectable for comparison: round_robin, least_loaded, prefix_affinity.

None of them pulls from peers; their decisions still carry the cost model's TTFT estimate so the
router's regret figures compare like with like.
"""

import random

from radixmesh.cluster.policy.base import PolicyConfig, RouteDecision, RouteRequest, register, within_load_cap
from radixmesh.cluster.policy.cost_model import CostModel
from radixmesh.cluster.policy.view import ClusterView, NodeView


def _decide(model: CostModel, request: RouteRequest, cluster: ClusterView, view: NodeView, reason: str
            ) -> RouteDecision:
    est = model.estimate(request, view, None, model.mates_work(cluster.nodes)(view))
    local = min(view.local_blocks, request.num_blocks)
    return RouteDecision(view.node, local, None, 0, est.total_s, reason)


def _least_loaded(nodes: list[NodeView], rng: random.Random) -> NodeView:
    """Fewest queued tokens, then fewest in flight; a random one among exact ties."""
    best = min((v.queued_tokens, v.inflight) for v in nodes)
    tied = [v for v in nodes if (v.queued_tokens, v.inflight) == best]
    return tied[0] if len(tied) == 1 else rng.choice(tied)


class RoundRobin:
    """Each request to the next node in the view's order, ignoring prefixes and load."""

    name = "round_robin"

    def __init__(self, config: PolicyConfig, rng: random.Random) -> None:
        self._model = CostModel(config)
        self._cursor = 0

    def route(self, request: RouteRequest, cluster: ClusterView) -> RouteDecision:
        view = cluster.nodes[self._cursor % len(cluster.nodes)]
        self._cursor += 1
        return _decide(self._model, request, cluster, view, "round robin")


class LeastLoaded:
    """The node with the fewest queued prompt tokens (then fewest requests in flight)."""

    name = "least_loaded"

    def __init__(self, config: PolicyConfig, rng: random.Random) -> None:
        self._model = CostModel(config)
        self._rng = rng

    def route(self, request: RouteRequest, cluster: ClusterView) -> RouteDecision:
        view = _least_loaded(list(cluster.nodes), self._rng)
        return _decide(self._model, request, cluster, view, f"least loaded ({view.queued_tokens} tokens queued)")


class PrefixAffinity:
    """Longest local prefix among the nodes within the bounded-load cap (the imbalance guard, in the
    spirit of SGLang's cache-aware router); least loaded among them when no node holds any block."""

    name = "prefix_affinity"

    def __init__(self, config: PolicyConfig, rng: random.Random) -> None:
        self._model = CostModel(config)
        self._eps = config.load_eps
        self._floor_s = config.load_floor_s
        self._rng = rng

    def route(self, request: RouteRequest, cluster: ClusterView) -> RouteDecision:
        ok = within_load_cap(cluster.nodes, self._eps, request, self._floor_s, cluster.fleet)
        longest = max(v.local_blocks for v in ok)
        if longest == 0:
            view = _least_loaded(ok, self._rng)
            return _decide(self._model, request, cluster, view, "no cached prefix: least loaded")
        view = _least_loaded([v for v in ok if v.local_blocks == longest], self._rng)
        return _decide(self._model, request, cluster, view, f"longest prefix: {longest} blocks")


register("round_robin")(RoundRobin)
register("least_loaded")(LeastLoaded)
register("prefix_affinity")(PrefixAffinity)
