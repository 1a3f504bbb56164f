"""What the router gives back (RoutedPlan, RouterResult); it takes in a ServePlan without a pull."""

from dataclasses import dataclass
from typing import TypeAlias

from radixmesh.cluster.policy.base import RouteDecision
from radixmesh.cluster.policy.pending_index import PendingHold
from radixmesh.cluster.policy.step import NoNodeAvailable
from radixmesh.cluster.policy.view import ClusterView
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.serve.plan import ServePlan, ServeResult, TokenDelta

__all__ = ["NoNodeAvailable", "RoutedPlan", "RouterItem", "RouterResult"]


@dataclass(frozen=True, slots=True)
class RoutedPlan:
    """A decision and the plan that executes it."""

    plan: ServePlan
    decision: RouteDecision
    policy: str
    """The policy that decided (the fallback while the metadata service is unreachable)."""
    cluster_tokens: int
    """Leading prompt tokens Match saw held somewhere in the cluster (0 without Match)."""
    metadata_used: bool
    view: ClusterView
    """What the policy saw (prefixes and load per candidate node), for explanations and audits."""
    hashes: tuple[BlockHash, ...] = ()
    """The prompt's leading full-block hashes the decision was made on (at most max_match_blocks)."""
    hold: PendingHold | None = None
    """The decision's pending record: whoever serves the plan ends it (RoutingStep.answered once the
    node answers, RoutingStep.abandon when the attempt fails); left alone it lasts pending_max_s."""


@dataclass(frozen=True, slots=True)
class RouterResult:
    """The agent's result of the attempt that finished, and what the router measured."""

    result: ServeResult
    routed: RoutedPlan
    attempts: int
    ttft_s: float
    """First token (or the result, when no token streamed) minus arrival at the router."""

    @property
    def cached_tokens(self) -> int:
        return self.result.stats.tokens.hits


RouterItem: TypeAlias = TokenDelta | RouterResult
