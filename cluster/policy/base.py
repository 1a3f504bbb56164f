"""The routing policy interface: what a policy sees, what it decides, bounded load, and the registry.

A policy is pure logic (no I/O, no clock reads of its own) so the HTTP router and the trace
simulator run the same code. The caller builds a `ClusterView` from the metadata service's Match
answer plus heartbeated load, calls `route`, and then executes (or simulates) the decision.
"""

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from radixmesh.cluster.policy.recent_work import DEFAULT_HALF_LIFE_S
from radixmesh.cluster.policy.view import ClusterView, FleetLoad, NodeView
from radixmesh.proto.ids import NodeId


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
class RouteDecision:
    """Where a request goes and what it reuses: blocks [0, local_blocks) from the node itself,
    [local_blocks, local_blocks + pull_blocks) pulled from `pull_from`, the rest prefilled."""

    node: NodeId
    local_blocks: int
    pull_from: NodeId | None
    pull_blocks: int
    est_ttft_s: float
    reason: str
    pull_s: float = 0.0
    """Estimated seconds of the pull (0 without one): the node's queue carries it until the prefill."""
    longest_ttft_s: float | None = None
    """Estimated TTFT at the candidate holding the longest prefix, when the decision reuses less than it
    holds (None: the decision took the longest, or the policy does not price it): what leaving it bought."""


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
    """Bounded load: a node is chosen only while its recent prompt tokens, this request included,
    stay within (1 + eps) x the mean (see `within_load_cap`)."""
    load_half_life_s: float = DEFAULT_HALF_LIFE_S
    """Half-life of the recent-work measure, seconds (see recent_work.DEFAULT_HALF_LIFE_S)."""
    load_floor_s: float = 0.5
    """Recent work below this many seconds of a node's prefill is not load: a node may always take a
    request that keeps it under the floor, so an idle cluster keeps siblings together. 0.5 s matched
    no floor on the bench traces where 2 s lost hit rate and balance (an earlier session's sweep)."""
    block_bytes: int = 64 * 2**20
    """KV bytes of one block (pull cost)."""
    host_bytes_per_s: float = 25e9
    """Host-to-gpu copy rate for the host-tier part of a local prefix."""
    disk_bytes_per_s: float = 1e9
    """Disk-tier read rate (verified, into the host tier) for a node that has not measured its own
    (NodeLoad.disk_read_gbps): bench/tiers.py read 0.5-1.4 GB/s from this box's virtio disk with the
    page cache dropped; an NVMe SSD reads several times faster, and the agents' figures replace it."""
    pull_latency_s: float = 0.003
    """Fixed cost of one pull (request round trip, the puller's two engine jobs, the owner's pin and
    unpin), paid once per request that pulls, for a pair of nodes whose puller has not measured one
    (NodeLoad.pull_latency_s). The steady state of an open channel, not the first pull: a channel's
    handshake (16-26 ms on the busy 2-core box) is paid once and the channel kept, and pricing every
    pull with it would keep a router from ever opening a channel for the prefixes that pay once it is
    open. Measured on the production path (bench/transfer.py, engines busy): ~3 ms for a 64 KiB pull."""
    pull_bytes_per_s: float = 2.5e9
    """Pull payload rate for a pair not measured yet (NodeLoad.pull_gbps): bench/transfer.py measured
    2.5-3.9 GB/s for 16-256 MiB pulls on the production path (shared memory on one host; TCP over
    loopback 2.5-3.8 GB/s raw), so the default is the low end; the agents' own figures replace it."""
    step_tokens: int = 512
    """Tokens of one engine step (the agents' EngineConfig.max_num_batched_tokens): how many steps a
    queue of prefill tokens spans, each with a decode pass over the running requests."""
    max_seqs: int = 64
    """Sequences an agent's engine runs at once (EngineConfig.max_num_seqs; the launcher passes its
    agents'): a request routed to a node with as many in flight waits for a slot (cost_model.seat_wait).
    0: not known (an external engine), not priced."""
    decode_pass_tokens: float = 32.0
    """One decode pass over the running requests costs this many prefill tokens' time plus one per
    request (a small batch's pass reads every weight once, as a short prefill chunk does)."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.load_floor_s) and self.load_floor_s >= 0):
            raise ValueError(f"load_floor_s must be a finite number >= 0, got {self.load_floor_s}")
        if not (math.isfinite(self.load_eps) and self.load_eps >= 0):
            raise ValueError(f"load_eps must be a finite number >= 0, got {self.load_eps}")
        if not (math.isfinite(self.load_half_life_s) and self.load_half_life_s > 0):
            raise ValueError(f"load_half_life_s must be a finite number > 0, got {self.load_half_life_s}")
        if self.block_bytes < 0:
            raise ValueError(f"block_bytes must be >= 0, got {self.block_bytes}")
        if (not self.host_bytes_per_s > 0 or not self.disk_bytes_per_s > 0 or not self.pull_bytes_per_s > 0
                or not self.pull_latency_s >= 0):
            raise ValueError("host_bytes_per_s, disk_bytes_per_s and pull_bytes_per_s must be > 0, "
                             "pull_latency_s >= 0")
        if self.max_seqs < 0:
            raise ValueError(f"max_seqs must be >= 0, got {self.max_seqs}")
        if self.step_tokens < 1 or not (math.isfinite(self.decode_pass_tokens) and self.decode_pass_tokens >= 0):
            raise ValueError("step_tokens must be >= 1 and decode_pass_tokens a finite number >= 0")


def within_load_cap(
    nodes: tuple[NodeView, ...], eps: float, request: RouteRequest, floor_s: float = 0.0,
    fleet: FleetLoad | None = None
) -> list[NodeView]:
    """Nodes that may take `request` under bounded load (Mirrokni et al., consistent hashing with
    bounded loads) on recent work, a node's `work` being the prompt tokens it would compute (those
    past its cached prefix), as recent work counts them:

        recent_tokens + work <= (1 + eps) x (total recent_tokens + work) / n,
        or <= floor_s x the node's prefill rate (below that floor work is not load).

    Charged the whole prompt instead, where recent work counts computed tokens only, a request for a
    cached 1,536-token document looked bigger than any node's share of a cluster that computes little:
    every node was over the cap, the request went to the least recently worked node, holder or not,
    and recomputed the document there (1-1.5% of the cost policy's decisions on the docs workload past
    the knee, half its computed tokens).

    Requests in flight are deliberately not a second cap: at low concurrency its ceiling (1 for a
    tiny mean) forbids queueing behind a prefix holder at all and so defeats prefix affinity, while
    recent work still bounds what each node is given over the run.

    A request too large for any node's work share (one bigger than eps x the mean window) goes to
    the nodes with the least recent work. Never empty, in the order of `nodes`. With `fleet`, the
    mean is the fleet's (`nodes` are then only the candidates scored).
    """
    if fleet is not None and fleet.nodes > 0:
        total, n = fleet.recent_tokens, fleet.nodes
    else:
        total, n = sum(v.recent_tokens for v in nodes), len(nodes)

    def fits(v: NodeView) -> bool:
        work = request.prompt_tokens - min(v.local_blocks, request.num_blocks) * request.block_tokens
        cap = max((1 + eps) * (total + work) / n, floor_s * v.prefill_tokens_per_s)
        # The relative slack absorbs float rounding of decayed sums, so equal loads compare equal.
        return v.recent_tokens + work <= cap * (1 + 1e-9)

    within = [v for v in nodes if fits(v)]
    if within:
        return within
    least = min(v.recent_tokens for v in nodes)
    return [v for v in nodes if v.recent_tokens <= least * (1 + 1e-9)]


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
    return sorted(_REGISTRY)


def make_policy(
    name: str, config: PolicyConfig | None = None, rng: random.Random | None = None
) -> RoutePolicy:
    """A fresh policy by registry name; ValueError naming the valid ones for an unknown name."""
    factory = _REGISTRY.get(name)
    if factory is None:
        raise ValueError(f"unknown policy {name!r}; valid: {', '.join(sorted(_REGISTRY))}")
    return factory(config or PolicyConfig(), rng or random.Random(0))

