"""What the router's policy sees: the metadata service's Match answer, the router's own in-flight
table and its speculative (pending) holders, merged into one ClusterView per request.

Load comes from the router itself, not from heartbeats: its in-flight counts and recent work change
the moment it routes, while a heartbeat is seconds old, and bounded load must hold for the burst in
between.
Measured rates (prefill tokens/s, pull GB/s) do come from heartbeats, since only agents see them.
"""

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from radixmesh.cluster.policy.base import ClusterView, NodeView, PolicyConfig
from radixmesh.cluster.policy.recent_work import RecentWork
from radixmesh.proto.ids import NodeId
from radixmesh.proto.metadata.messages import MatchResult, NodeMatch

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class Ticket:
    """One request the router has sent to `node`; `queued_tokens` count until its prefill ends."""

    node: NodeId
    queued_tokens: int
    prefilled: bool = False
    finished: bool = False


class InflightTable:
    """Per node: requests routed and not finished, prompt tokens routed and not yet prefilled, and
    recent work (prompt tokens routed, decayed with `half_life_s` on `clock`; see RecentWork).

    Every `start` is matched by one `finish` (which implies `prefilled`); both are idempotent per
    ticket, so a retry path that finishes twice cannot drive a count negative.
    """

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, half_life_s: float = PolicyConfig().load_half_life_s
    ) -> None:
        self._recent = RecentWork(half_life_s, clock)
        self._inflight: dict[NodeId, int] = {}
        self._queued: dict[NodeId, int] = {}
        self._open: list[Ticket] = []

    def start(self, node: NodeId, queued_tokens: int) -> Ticket:
        if queued_tokens < 0:
            raise ValueError(f"queued_tokens must be >= 0, got {queued_tokens}")
        ticket = Ticket(node, queued_tokens)
        self._inflight[node] = self._inflight.get(node, 0) + 1
        self._queued[node] = self._queued.get(node, 0) + queued_tokens
        self._open.append(ticket)
        return ticket

    def prefilled(self, ticket: Ticket) -> None:
        """The request's first token arrived: its prompt no longer waits on the node."""
        if not ticket.prefilled:
            ticket.prefilled = True
            self._queued[ticket.node] -= ticket.queued_tokens

    def finish(self, ticket: Ticket) -> None:
        if ticket.finished:
            return
        self.prefilled(ticket)
        ticket.finished = True
        self._inflight[ticket.node] -= 1
        self._open.remove(ticket)

    def record_routed(self, node: NodeId, prompt_tokens: int) -> None:
        """`node` was sent a request of `prompt_tokens` (each attempt counts: each is work there)."""
        self._recent.add(node, prompt_tokens)

    def recent_tokens(self, node: NodeId) -> float:
        return self._recent.value(node)

    def inflight(self, node: NodeId) -> int:
        return self._inflight.get(node, 0)

    def queued_tokens(self, node: NodeId) -> int:
        return self._queued.get(node, 0)

    def check_invariants(self) -> None:
        """Counts equal the open tickets' sums; nothing is negative."""
        self._recent.check_invariants()
        for node in set(self._inflight) | set(self._queued):
            mine = [t for t in self._open if t.node == node]
            queued = sum(t.queued_tokens for t in mine if not t.prefilled)
            assert self.inflight(node) == len(mine), f"{node}: inflight {self.inflight(node)} != {len(mine)}"
            assert self.queued_tokens(node) == queued, f"{node}: queued {self.queued_tokens(node)} != {queued}"


@dataclass(frozen=True, slots=True)
class CandidateView:
    """The policy's input plus what executing its decision needs."""

    cluster: ClusterView
    addresses: Mapping[NodeId, str]
    """Transfer address of each candidate the metadata service knows (pull peers need one)."""
    cluster_blocks: int
    """Leading prompt blocks held by some live node, per Match (0 without it)."""


def build_view(
    candidates: Sequence[NodeId],
    match: MatchResult | None,
    pending: Mapping[NodeId, int],
    table: InflightTable,
    default_prefill_tokens_per_s: float,
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
    return CandidateView(ClusterView(tuple(views), bandwidth), addresses, match.cluster_blocks if match else 0)
