"""What a routing policy sees (NodeView per candidate, one ClusterView per request) and how the
router builds it: the metadata service's Match answer, the router's own in-flight table and its
speculative (pending) holders, merged.

Load comes from the router itself (policy.inflight), not from heartbeats. Measured rates (prefill tokens/s, pull GB/s) do come from heartbeats, since only agents see them.
"""

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from radixmesh.proto.ids import NodeId
from radixmesh.proto.metadata.messages import MatchResult, NodeMatch


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
    """Requests routed to this node and not finished: a tie-break for least_loaded and cost, not a
    load cap (see `within_load_cap`)."""
    prefill_tokens_per_s: float = 1.0
    """Measured prefill rate."""
    recent_tokens: float = 0.0
    """Prompt tokens routed to this node, exponentially decayed (`RecentWork`); bounds load over time."""

    def __post_init__(self) -> None:
        if not 0 <= self.gpu_blocks <= self.local_blocks:
            raise ValueError(
                f"need 0 <= gpu_blocks <= local_blocks, got {self.gpu_blocks}, {self.local_blocks}"
            )
        if self.queued_tokens < 0 or self.inflight < 0:
            raise ValueError("queued_tokens and inflight must be >= 0")
        if not (math.isfinite(self.recent_tokens) and self.recent_tokens >= 0):
            raise ValueError(f"recent_tokens must be finite and >= 0, got {self.recent_tokens}")
        if not (math.isfinite(self.prefill_tokens_per_s) and self.prefill_tokens_per_s > 0):
            raise ValueError(f"prefill_tokens_per_s must be finite and > 0, got {self.prefill_tokens_per_s}")


@dataclass(frozen=True, slots=True)
class FleetLoad:
    """Recent work over the whole fleet, when the view holds only some of its nodes."""

    nodes: int
    recent_tokens: float


@dataclass(frozen=True, slots=True)
class ClusterView:
    """The candidate nodes, and the measured pull bandwidth between them."""

    nodes: tuple[NodeView, ...]
    pull_bytes_per_s: Mapping[tuple[NodeId, NodeId], float] = field(default_factory=dict)
    """(puller, holder) -> measured bytes/s; pairs not measured use the default."""
    default_pull_bytes_per_s: float = 10e9
    fleet: FleetLoad | None = None
    """Set when `nodes` are a subset (the prefix holders and the least loaded): bounded load then
    compares with the fleet's mean, not the candidates'. None: the candidates are the fleet."""

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
class CandidateView:
    """The policy's input plus what executing its decision needs."""

    cluster: ClusterView
    addresses: Mapping[NodeId, str]
    """Transfer address of each candidate the metadata service knows (pull peers need one)."""
    cluster_blocks: int
    """Leading prompt blocks held by some live node, per Match (0 without it)."""


class NodeLoads(Protocol):
    """Per-node load as a view reads it: the router's InflightTable, or the simulator's node queues."""

    def queued_tokens(self, node: NodeId) -> int: ...

    def inflight(self, node: NodeId) -> int: ...

    def recent_tokens(self, node: NodeId) -> float: ...


def build_view(
    candidates: Sequence[NodeId],
    match: MatchResult | None,
    pending: Mapping[NodeId, int],
    table: NodeLoads,
    default_prefill_tokens_per_s: float,
    fleet: FleetLoad | None = None,
    default_pull_bytes_per_s: float = 10e9,
) -> CandidateView:
    """Views of `candidates` (in the given order), sorted nowhere else so round robin is stable.

    A node's prefix is the longer of the index's answer and its pending (speculative) prefix; the
    pending part counts as gpu, where the node's fresh prefill will put it.
    Raises ValueError when `candidates` is empty.
    """
    found: dict[NodeId, NodeMatch] = {m.node_id: m for m in match.nodes} if match is not None else {}
    views = []
    bandwidth: dict[tuple[NodeId, NodeId], float] = {}
    for node in candidates:
        m = found.get(node)
        extra = pending.get(node, 0)
        gpu = max(m.gpu_blocks if m else 0, extra)
        rate = m.load.prefill_tokens_per_s if m and m.load.prefill_tokens_per_s > 0 else default_prefill_tokens_per_s
        views.append(
            NodeView(
                node,
                gpu_blocks=gpu,
                local_blocks=max(m.any_tier_blocks if m else 0, gpu),
                queued_tokens=table.queued_tokens(node),
                inflight=table.inflight(node),
                recent_tokens=table.recent_tokens(node),
                prefill_tokens_per_s=rate,
            )
        )
        if m is not None:
            for peer, gbps in m.load.pull_gbps.items():
                if gbps > 0:
                    bandwidth[(node, NodeId(peer))] = gbps * 1e9
    addresses = {n: found[n].transfer_address for n in candidates if n in found}
    cluster = ClusterView(tuple(views), bandwidth, default_pull_bytes_per_s, fleet)
    return CandidateView(cluster, addresses, match.cluster_blocks if match else 0)
