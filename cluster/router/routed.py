"""What the router takes in (GenerateRequest) and gives back (RoutedPlan, RouterResult)."""

from dataclasses import dataclass
from typing import TypeAlias

from radixmesh.cluster.policy.base import RouteDecision
from radixmesh.cluster.policy.view import ClusterView
from radixmesh.proto.ids import NodeId
from radixmesh.proto.serve.plan import ServePlan, ServeResult, TokenDelta
from radixmesh.proto.serve.sampling import SamplingParams


class NoNodeAvailable(Exception):
    """Every candidate node was unavailable (or there was none): the request could not be served."""


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    """One prompt in token ids. `sampling.seed` None: the router fixes one (retries reproduce it)."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingParams
    tenant: str = ""
    node: NodeId | None = None
    """Serve on this node while it is a candidate (choices 2..n of one prompt follow the first to
    its cached prefix); None, or a node that left: routed as any request."""


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
