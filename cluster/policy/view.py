"""What a routing policy sees (NodeView per candidate, one ClusterView per request) and how the
router builds it: the metadata service's Match answer, the router's own in-flight table and its
speculative (pending) holders, merged.

Load comes from the router itself (policy.inflight), not from heartbeats. Measured prices (step
floor, prefill tokens/s, per peer pull bandwidth and fixed cost) and who shares cores (the compute group) do come
from heartbeats, since only agents see them; what no agent measured yet is priced by the cost
model's conservative defaults (PolicyConfig), not here, except the step floor: a node that has not
yet run a decode-only step (new, or idle since it joined) borrows its fleet's median floor. Priced
without one, it looked a whole step cheaper than every node that had served, so a request whose
cached prefix saved less than a step went to a cold node instead of its cache.
"""

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from radixmesh.proto.ids import NodeId
from radixmesh.proto.metadata.messages import MatchResult, NodeMatch


@dataclass(frozen=True, slots=True)
class NodeView:
    """One candidate node: its contiguous prefix of the prompt by tier, and its load."""

    node: NodeId
    gpu_blocks: int = 0
    """Blocks 0..gpu_blocks-1 of the prompt are on this node's gpu tier (or will be: pending)."""
    local_blocks: int = 0
    """Blocks 0..local_blocks-1 are on this node on some tier (>= gpu_blocks), or pending there: routed
    to it and not yet computed, which the node's own queue computes before a later request runs. The
    part beyond gpu_blocks is swapped in from host memory, its last `disk_blocks` read from disk."""
    queued_tokens: int = 0
    """Prompt tokens waiting for (or in) prefill on this node."""
    inflight: int = 0
    """Requests routed to this node and not finished: a tie-break for least_loaded and cost, not a
    load cap (see `within_load_cap`)."""
    prefill_tokens_per_s: float = 1.0
    """Measured prefill rate (beyond the step floor, when one is measured)."""
    recent_tokens: float = 0.0
    """Prompt tokens routed to this node, exponentially decayed (`RecentWork`); bounds load over time."""
    held_blocks: int = 0
    """Blocks 0..held_blocks-1 are computed and in this node's gpu tier (the index says so): what a peer
    can pull (its transfer source serves the gpu cache; host and disk copies it reads for itself).
    Pending blocks are not: a pull from a node still computing them gets nothing, and the puller
    recomputes them after paying for the pull."""
    running_decodes: int = 0
    """Requests past their prefill and still generating here: each engine step runs their decode pass."""
    pulling_s: float = 0.0
    """Estimated seconds of pulls planned to this node and not yet done (they precede those prefills)."""
    compute_group: str = ""
    """Nodes of one non-empty group share cores (NodeLoad.compute_group)."""
    compute_share: float = 0.0
    """The share of the group's cores this node computes on (NodeLoad.compute_share; 0: unknown, the
    whole group)."""
    disk_blocks: int = 0
    """The tail of the local prefix past its gpu and host runs: read from the node's disk tier."""
    disk_bytes_per_s: float = 0.0
    """The node's measured disk read rate (0: not measured, the configured default applies)."""
    step_floor_s: float = 0.0
    """Measured seconds of an engine step before its prefill tokens (NodeLoad.step_floor_s; 0: not
    measured, the cost model prices a step's decode pass in prefill tokens instead)."""
    decode_s: float = 0.0
    """Mean seconds a request here decodes after its first token, as the router saw its requests
    finish (InflightTable.decode_s; 0: none finished yet): how soon a running request frees its
    sequence slot."""

    def __post_init__(self) -> None:
        if not 0 <= self.gpu_blocks <= self.local_blocks:
            raise ValueError(
                f"need 0 <= gpu_blocks <= local_blocks, got {self.gpu_blocks}, {self.local_blocks}"
            )
        if not 0 <= self.disk_blocks <= self.local_blocks - self.gpu_blocks:
            raise ValueError(f"need 0 <= disk_blocks <= local_blocks - gpu_blocks, got {self.disk_blocks}")
        if not (math.isfinite(self.disk_bytes_per_s) and self.disk_bytes_per_s >= 0):
            raise ValueError(f"disk_bytes_per_s must be a finite number >= 0, got {self.disk_bytes_per_s}")
        if not 0 <= self.held_blocks <= self.local_blocks:
            raise ValueError(f"need 0 <= held_blocks <= local_blocks, got {self.held_blocks}, {self.local_blocks}")
        if self.queued_tokens < 0 or self.inflight < 0 or self.running_decodes < 0:
            raise ValueError("queued_tokens, inflight and running_decodes must be >= 0")
        if not (math.isfinite(self.step_floor_s) and self.step_floor_s >= 0):
            raise ValueError(f"step_floor_s must be finite and >= 0, got {self.step_floor_s}")
        if not (math.isfinite(self.decode_s) and self.decode_s >= 0):
            raise ValueError(f"decode_s must be finite and >= 0, got {self.decode_s}")
        if not (math.isfinite(self.pulling_s) and self.pulling_s >= 0):
            raise ValueError(f"pulling_s must be finite and >= 0, got {self.pulling_s}")
        if not (math.isfinite(self.recent_tokens) and self.recent_tokens >= 0):
            raise ValueError(f"recent_tokens must be finite and >= 0, got {self.recent_tokens}")
        if not (math.isfinite(self.prefill_tokens_per_s) and self.prefill_tokens_per_s > 0):
            raise ValueError(f"prefill_tokens_per_s must be finite and > 0, got {self.prefill_tokens_per_s}")

    @property
    def queued_requests(self) -> int:
        """Requests in flight here that have not begun decoding: waiting for or in their prefill."""
        return max(0, self.inflight - self.running_decodes)

    @property
    def pending_blocks(self) -> int:
        """Leading blocks this node will have computed once its queue ran, beyond what it holds now
        (0 when it is computing none of the prompt)."""
        return self.local_blocks if self.local_blocks > self.held_blocks else 0


@dataclass(frozen=True, slots=True)
class FleetLoad:
    """Recent work over the whole fleet, when the view holds only some of its nodes."""

    nodes: int
    recent_tokens: float


@dataclass(frozen=True, slots=True)
class ClusterView:
    """The candidate nodes, and the pull prices measured between them."""

    nodes: tuple[NodeView, ...]
    pull_bytes_per_s: Mapping[tuple[NodeId, NodeId], float] = field(default_factory=dict)
    """(puller, holder) -> measured payload bytes/s; pairs not measured are priced by the cost model's default."""
    pull_latency_s: Mapping[tuple[NodeId, NodeId], float] = field(default_factory=dict)
    """(puller, holder) -> measured fixed cost of one pull, seconds; likewise."""
    fleet: FleetLoad | None = None
    """Set when `nodes` are a subset (the prefix holders and the least loaded): bounded load then
    compares with the fleet's mean, not the candidates'. None: the candidates are the fleet."""
    move_margin_s: float = 0.0
    """How far apart two TTFT estimates must be before the difference is believed: the router's
    recent 90th-percentile absolute TTFT error times sqrt(2) (Calibration.move_margin_s); 0 where estimates are exact (the
    simulator). The cost policy leaves a longer cached prefix behind only for a gain beyond it."""
    pull_time_factor: float = 1.0
    """Realized over priced time of the router's recent pulls, median (Calibration.pull_time_factor);
    1 before enough pulls were measured, and in the simulator, whose pulls take their priced time.
    The cost model prices each pull that many times its wire time."""
    wait_time_factor: float = 1.0
    """Realized over predicted wait of the router's recent decisions, median (Calibration.wait_time_factor):
    each node's view is that much slower than its measured prefill rate and step floor say."""
    peers: tuple[NodeView, ...] = ()
    """Holders a candidate may pull from that the request may not go to (a split cluster's decode
    agents while a prompt is routed to its prefill agents: docs/disaggregation.md)."""

    def __post_init__(self) -> None:
        if not self.nodes:
            raise ValueError("no candidate nodes: the cluster has no live node")
        everyone = [v.node for v in (*self.nodes, *self.peers)]
        if len(set(everyone)) != len(everyone):
            raise ValueError("a node appears twice in the cluster view")


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

    def running_decodes(self, node: NodeId) -> int: ...

    def pulling_s(self, node: NodeId) -> float: ...

    def decode_s(self, node: NodeId) -> float: ...


def build_view(
    candidates: Sequence[NodeId],
    match: MatchResult | None,
    pending: Mapping[NodeId, int],
    table: NodeLoads,
    default_prefill_tokens_per_s: float,
    fleet: FleetLoad | None = None,
    *,
    computed: Mapping[NodeId, int] | None = None,
    move_margin_s: float = 0.0,
    pull_time_factor: float = 1.0,
    wait_time_factor: float = 1.0,
) -> CandidateView:
    """Views of `candidates` (in the given order), sorted nowhere else so round robin is stable.

    A node's prefix is the longer of the index's answer and its pending (speculative) prefix; the
    pending part counts as gpu, where the node's fresh prefill will put it, but not as held (pullable)
    unless `computed` says the node has computed it (PendingIndex.match(computed=True)).
    Each node's measured prefill rate and step floor are scaled by `wait_time_factor` (the time its
    engine's steps leave out, ClusterView.wait_time_factor). Raises ValueError when `candidates` is empty.
    """
    found: dict[NodeId, NodeMatch] = {m.node_id: m for m in match.nodes} if match is not None else {}
    views = []
    bandwidth: dict[tuple[NodeId, NodeId], float] = {}
    latency: dict[tuple[NodeId, NodeId], float] = {}
    for node in candidates:
        m = found.get(node)
        extra = pending.get(node, 0)
        gpu = max(m.gpu_blocks if m else 0, extra)
        rate = m.load.prefill_tokens_per_s if m and m.load.prefill_tokens_per_s > 0 else default_prefill_tokens_per_s
        # A peer's transfer source serves its gpu cache only: host and disk copies are the node's own.
        held = max(m.gpu_blocks if m else 0, (computed or {}).get(node, 0))
        # Past its gpu-or-host run the node's prefix continues on disk (index.PrefixLengths).
        disk = max(0, m.any_tier_blocks - max(gpu, m.host_blocks)) if m else 0
        views.append(
            NodeView(
                node,
                gpu_blocks=gpu,
                local_blocks=max(held, gpu, m.any_tier_blocks if m else 0),
                disk_blocks=disk,
                disk_bytes_per_s=m.load.disk_read_gbps * 1e9 if m else 0.0,
                queued_tokens=table.queued_tokens(node),
                inflight=table.inflight(node),
                recent_tokens=table.recent_tokens(node),
                prefill_tokens_per_s=rate / wait_time_factor,
                step_floor_s=m.load.step_floor_s * wait_time_factor if m else 0.0,
                held_blocks=held,
                running_decodes=table.running_decodes(node),
                pulling_s=table.pulling_s(node),
                decode_s=table.decode_s(node),
                compute_group=m.load.compute_group if m else "",
                compute_share=m.load.compute_share if m else 0.0,
            )
        )
        if m is not None:
            for peer, gbps in m.load.pull_gbps.items():
                if gbps > 0:
                    bandwidth[(node, NodeId(peer))] = gbps * 1e9
            for peer, seconds in m.load.pull_latency_s.items():
                if seconds > 0:
                    latency[(node, NodeId(peer))] = seconds
    floors = sorted(v.step_floor_s for v in views if v.step_floor_s)
    if floors:
        borrowed = floors[len(floors) // 2]
        views = [v if v.step_floor_s else replace(v, step_floor_s=borrowed) for v in views]
    addresses = {n: found[n].transfer_address for n in candidates if n in found}
    cluster = ClusterView(tuple(views), bandwidth, latency, fleet, move_margin_s, pull_time_factor, wait_time_factor)
    return CandidateView(cluster, addresses, match.cluster_blocks if match else 0)
