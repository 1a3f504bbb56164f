"""The routing policy interface: what a policy sees, what it decides, bounded load, and the registry.

A policy is pure logic (no I/O, no clock reads of its own) so the HTTP router and the trace
simulator run the same code. The caller builds a `ClusterView` from the metadata service's Match
answer plus heartbeated load, calls `route`, and then executes (or simulates) the decision.
"""

import logging
import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from radixmesh.node_agent.ids import NodeId

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RouteRequest:
    """One prompt as the router sees it."""

    prompt_tokens: int
    """Tokens of the prompt; the part beyond the reused blocks is prefilled."""
    num_blocks: int
    """Full blocks of the prompt (the hashes the index was asked about)."""
    block_tokens: int
    """Tokens per block."""

    def __post_init__(self) -> None:
        if self.block_tokens < 1:
            raise ValueError(f"block_tokens must be >= 1, got {self.block_tokens}")
        if self.num_blocks < 0 or self.prompt_tokens < self.num_blocks * self.block_tokens:
            raise ValueError(
                f"{self.num_blocks} blocks of {self.block_tokens} tokens do not fit in a "
                f"{self.prompt_tokens}-token prompt"
            )


@dataclass(frozen=True, slots=True)
class NodeView:
    """One candidate node: its contiguous prefix of the prompt by tier, and its load."""

    node: NodeId
    gpu_blocks: int = 0
    """Blocks 0..gpu_blocks-1 of the prompt are on this node's gpu tier."""
    local_blocks: int = 0
    """Blocks 0..local_blocks-1 are on this node on some tier (>= gpu_blocks); the part beyond
    gpu_blocks is swapped in from host memory."""
    queued_tokens: int = 0
    """Prompt tokens waiting for (or in) prefill on this node."""
    inflight: int = 0
    """Requests routed to this node and not finished; the bounded-load measure."""
    prefill_tokens_per_s: float = 1.0
    """Measured prefill rate."""

    def __post_init__(self) -> None:
        if not 0 <= self.gpu_blocks <= self.local_blocks:
            raise ValueError(
                f"need 0 <= gpu_blocks <= local_blocks, got {self.gpu_blocks}, {self.local_blocks}"
            )
        if self.queued_tokens < 0 or self.inflight < 0:
            raise ValueError("queued_tokens and inflight must be >= 0")
        if not (math.isfinite(self.prefill_tokens_per_s) and self.prefill_tokens_per_s > 0):
            raise ValueError(f"prefill_tokens_per_s must be finite and > 0, got {self.prefill_tokens_per_s}")


@dataclass(frozen=True, slots=True)
class ClusterView:
    """Every candidate node, and the measured pull bandwidth between them."""

    nodes: tuple[NodeView, ...]
    pull_bytes_per_s: Mapping[tuple[NodeId, NodeId], float] = field(default_factory=dict)
    """(puller, holder) -> measured bytes/s; pairs not measured use the default."""
    default_pull_bytes_per_s: float = 10e9

    def __post_init__(self) -> None:
        if not self.nodes:
            raise ValueError("no candidate nodes: the cluster has no live node")
        if len({v.node for v in self.nodes}) != len(self.nodes):
            raise ValueError("a node appears twice in the cluster view")
        if not self.default_pull_bytes_per_s > 0:
            raise ValueError("default_pull_bytes_per_s must be > 0")

    def bandwidth(self, puller: NodeId, holder: NodeId) -> float:
        return self.pull_bytes_per_s.get((puller, holder), self.default_pull_bytes_per_s)


@dataclass(frozen=True, slots=True)
class RouteDecision:
    """Where a request goes and what it reuses: blocks [0, local_blocks) from the node itself,
    [local_blocks, local_blocks + pull_blocks) pulled from `pull_from`, the rest prefilled."""

    node: NodeId
    local_blocks: int
    pull_from: NodeId | None
    pull_blocks: int
    est_ttft_s: float
    reason: str


class RoutePolicy(Protocol):
    """Picks a node for each request.

    `route` must return a node of `cluster.nodes`; it may keep state between calls (a round-robin
    cursor) but reads no clock and draws randomness only from the source it was built with.
    """

    name: str

    def route(self, request: RouteRequest, cluster: ClusterView) -> RouteDecision: ...


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """Settings shared by the policies."""

    load_eps: float = 0.25
    """Bounded load: no node is chosen past ceil((1 + eps) x mean in-flight requests) while another
    node is within it."""
    block_bytes: int = 64 * 2**20
    """KV bytes of one block (pull cost)."""
    host_bytes_per_s: float = 25e9
    """Host-to-gpu copy rate for the host-tier part of a local prefix."""
    pull_latency_s: float = 0.002
    """Fixed cost of one pull (setup, handshake), paid once per request that pulls."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.load_eps) and self.load_eps >= 0):
            raise ValueError(f"load_eps must be a finite number >= 0, got {self.load_eps}")
        if self.block_bytes < 0:
            raise ValueError(f"block_bytes must be >= 0, got {self.block_bytes}")
        if not self.host_bytes_per_s > 0 or not self.pull_latency_s >= 0:
            raise ValueError("host_bytes_per_s must be > 0 and pull_latency_s >= 0")


def within_load_cap(nodes: tuple[NodeView, ...], eps: float) -> list[NodeView]:
    """Nodes that may take one more request under bounded load (Mirrokni et al., consistent hashing
    with bounded loads): inflight + 1 <= ceil((1 + eps) x (total inflight + 1) / n).

    Never empty: the least loaded node always fits (its load is at most the mean).
    """
    total = sum(v.inflight for v in nodes)
    cap = math.ceil((1 + eps) * (total + 1) / len(nodes) - 1e-9)
    ok = [v for v in nodes if v.inflight + 1 <= cap]
    assert ok, f"bounded load left no node: cap {cap}, total {total}, n {len(nodes)}"
    return ok


PolicyFactory = Callable[[PolicyConfig, random.Random], RoutePolicy]
_REGISTRY: dict[str, PolicyFactory] = {}


def register(name: str) -> Callable[[PolicyFactory], PolicyFactory]:
    """Decorator: make a policy factory available to `make_policy` under `name`."""

    def add(factory: PolicyFactory) -> PolicyFactory:
        assert name not in _REGISTRY, f"policy {name} registered twice"
        _REGISTRY[name] = factory
        return factory

    return add


def policy_names() -> list[str]:
    _load_builtins()
    return sorted(_REGISTRY)


def make_policy(
    name: str, config: PolicyConfig | None = None, rng: random.Random | None = None
) -> RoutePolicy:
    """A fresh policy by registry name; ValueError naming the valid ones for an unknown name."""
    _load_builtins()
    factory = _REGISTRY.get(name)
    if factory is None:
        raise ValueError(f"unknown policy {name!r}; valid: {', '.join(sorted(_REGISTRY))}")
    return factory(config or PolicyConfig(), rng or random.Random(0))


def _load_builtins() -> None:
    # The policy modules register themselves on import; importing here (not at module top) avoids
    # an import cycle, since they import this module for the interface.
    from radixmesh.cluster import policy_baseline, policy_cost  # noqa: F401
