"""Estimated time to first token of a request on one node, the quantity the `cost` policy minimises.

    TTFT = queue (waiting prefill + pulls in progress + decode passes of running requests
                  + the wait for a sequence slot)
           + host swap-in and disk read of the local prefix
           + pull of the blocks a peer has computed beyond the local prefix (only when cheaper than recomputing them)
           + prefill of the rest
           + the time nodes sharing this node's cores take from it (processor sharing)

Block ranges of the prompt, for a candidate with local prefix L and a peer that computed H > L::

    [0, L)  local (gpu, then host)   [L, H)  pulled from the peer   [H, n)  prefilled (+ the partial tail)

How each term is priced (pulls, steps, sequence slots, sharing) and why: docs/routing.md#the-cost-model.
"""

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

from radixmesh.cluster.policy.base import PolicyConfig, RouteRequest
from radixmesh.cluster.policy.view import NodeView
from radixmesh.proto.ids import NodeId


class Holder(NamedTuple):
    """A peer that has computed blocks 0..blocks-1 of the prompt, and what our pulls from it measured
    (None: not measured, the configured default applies)."""

    node: NodeId
    blocks: int
    bytes_per_s: float | None = None
    latency_s: float | None = None
    time_factor: float = 1.0
    """What pulls have realized over what they were priced (ClusterView.pull_time_factor): each pull
    from it is priced that many times its wire time."""


class TTFTEstimate(NamedTuple):
    total_s: float
    queue_s: float
    """Work ahead of the prefill: waiting prefill, pulls in progress, decode passes (also those during
    this request's own prefill), and the wait for a sequence slot."""
    swap_s: float
    pull_s: float
    prefill_s: float
    pull_blocks: int
    """0 when no peer computed more, or pulling them is not cheaper than recomputing."""
    shared_s: float = 0.0
    """Time the node's compute group takes from this request's work."""

    @property
    def work_s(self) -> float:
        """The work this request adds to the node's queue: tier reads, pull and prefill."""
        return self.swap_s + self.pull_s + self.prefill_s


def step_time(view: NodeView, config: PolicyConfig) -> float:
    """Seconds of `view`'s node's next engine step: a chunk of up to `step_tokens` of its queued
    prefill, plus its measured floor, or, with none measured, the decode pass of its running requests
    priced in prefill tokens."""
    tokens = min(config.step_tokens, view.queued_tokens)
    if view.step_floor_s:
        return view.step_floor_s + tokens / view.prefill_tokens_per_s
    decode = config.decode_pass_tokens + view.running_decodes if view.running_decodes else 0.0
    return (tokens + decode) / view.prefill_tokens_per_s


def step_in_progress(view: NodeView, config: PolicyConfig) -> float:
    """Expected seconds a new request waits for `view`'s node's step in progress before its own can
    start: half a step on average (`step_time`) while the node runs anything, else none.

    Behind a full step's worth of queued prefill that step is the queue's first, which `queue_time`
    already counts whole, so the engine alone would take a step less (the engine simulator, convo at
    28/s on 8 modeled H100s: realized over predicted 0.58 at the median; 0.74 without the half
    step), while on a live cluster it stood for host time nothing else priced (the same cell live
    on the 2-core box read 1.21 with it and 1.63 without). The router's wait time factor
    (Calibration.wait_time_factor) now scales each view to what its decisions realized, either way;
    the half step is where the estimates start before the factor has 16 decisions
    (docs/routing.md#the-cost-model)."""
    return 0.5 * step_time(view, config) if view.inflight else 0.0


def seat_wait(view: NodeView, config: PolicyConfig) -> float:
    """Expected seconds a new request waits on `view`'s node for a sequence slot (docs/routing.md#the-cost-model):
    0 below the engine's `max_seqs`, where nothing is measured yet, or where the cap is unknown."""
    ahead = view.inflight - config.max_seqs + 1
    if not config.max_seqs or ahead <= 0:
        return 0.0
    return ahead / (config.max_seqs + 1) * view.decode_s


def delay_to_others(view: NodeView, extra_s: float, extra_compute_s: float) -> float:
    """Seconds of waiting `extra_s` more work on `view`'s node adds to the requests there, in all;
    `extra_compute_s`, the part of it the engine's steps compute (tier reads and prefill, not a pull,
    which runs beside the forward).

    Queued: a queue (M/M/1) at utilization rho gives each second of work it is handed a marginal cost
    to the others of rho / (1 - rho)^2 seconds of waiting: the work delays every request that arrives
    before the backlog it extends has drained. rho is read off the n requests waiting or prefilling
    there (the M/M/1 mean, n = rho / (1 - rho)), so the factor is n (n + 1): 0 on an idle node, 2 behind
    one request, 30 behind five. An instantaneous count, not a rate the router would have to learn.

    Decoding: every request past its prefill there runs in the same steps as the prefill (chunked
    prefill mixes them), so each waits `extra_compute_s` once for its next token. Unpriced, on the
    agent workload (8 modeled H100 agents, 15 req/s) `cost` left a session's node in 9.6% of its
    decisions to recompute its history beside ~30 running decodes: inter-token p50 2.05 s against
    prefix affinity's 1.34 s, TTFT p50 5.2 s against 3.6 s (docs/routing.md#the-cost-model).
    """
    n = view.queued_requests
    return extra_s * n * (n + 1) + extra_compute_s * view.running_decodes


def sharing(view: NodeView, busy_mates: Sequence[NodeView]) -> float:
    """The fraction of each busy mate's work that delays `view`'s node's (docs/routing.md#the-cost-model):
    0 while their compute shares and its own fit in the cores, 1 where any share is unknown."""
    if not busy_mates:
        return 0.0
    shares = [view.compute_share, *(u.compute_share for u in busy_mates)]
    if not all(shares):
        return 1.0
    return min(1.0, (max(1.0, sum(shares)) - 1.0) / len(busy_mates))


class CostModel:
    """Linear time model: prefill and copies cost per token/byte at the measured (or default) rates."""

    def __init__(self, config: PolicyConfig) -> None:
        self.config = config

    def mates_work(self, nodes: Sequence[NodeView]) -> Callable[[NodeView], list[float]]:
        """For a node of `nodes`, the work (`queue_time`) of the other nodes of its compute group, each
        scaled by how far the busy ones overrun the group's cores with it (`sharing`): the `shared`
        argument of `estimate` (every policy's estimate prices sharing alike, so their calibration
        reports compare)."""
        groups: dict[str, list[NodeView]] = {}
        for v in nodes:
            # An idle mate takes nothing from the cores (queue_time's one step is a new request's).
            if v.compute_group and (v.inflight or v.queued_tokens or v.running_decodes or v.pulling_s):
                groups.setdefault(v.compute_group, []).append(v)

        def shared(v: NodeView) -> list[float]:
            busy = [u for u in groups.get(v.compute_group, ()) if u.node != v.node] if v.compute_group else []
            f = sharing(v, busy)
            return [f * self.queue_time(u) for u in busy] if f else []
        return shared

    def pull_time(self, blocks: int, bytes_per_s: float | None = None, latency_s: float | None = None) -> float:
        """Seconds to pull `blocks` blocks in one transfer (0 for none); None prices at the defaults."""
        if blocks <= 0:
            return 0.0
        c = self.config
        fixed = c.pull_latency_s if latency_s is None else latency_s
        return fixed + blocks * c.block_bytes / (c.pull_bytes_per_s if bytes_per_s is None else bytes_per_s)

    def steps_time(self, view: NodeView, tokens: int) -> float:
        """Seconds `view`'s node's steps take beyond their prefill tokens while it computes `tokens`
        of prefill (one step per `step_tokens`, at least one): the measured floor of each, or, with
        none measured, the running requests' decode passes (none when nothing runs)."""
        steps = max(1, math.ceil(tokens / self.config.step_tokens))
        if view.step_floor_s:
            return steps * view.step_floor_s
        if view.running_decodes == 0:
            return 0.0
        return steps * (self.config.decode_pass_tokens + view.running_decodes) / view.prefill_tokens_per_s

    def queue_time(self, view: NodeView, tokens: int = 0) -> float:
        """Seconds of work ahead on `view`'s node: waiting prefill, pulls in progress, the steps during
        that prefill and `tokens` more of a new request's, and (with a measured floor) the step in
        progress."""
        current = step_in_progress(view, self.config) if view.step_floor_s else 0.0
        return (view.queued_tokens / view.prefill_tokens_per_s + view.pulling_s
                + self.steps_time(view, view.queued_tokens + tokens) + current)

    def estimate(self, request: RouteRequest, view: NodeView, holder: Holder | None,
                 shared: Sequence[float] = ()) -> TTFTEstimate:
        """TTFT of `request` on `view`'s node, pulling from `holder` when that pays; `shared`: the
        work (seconds, `queue_time`) of the other nodes of its compute group."""
        rate = view.prefill_tokens_per_s
        c = self.config
        local = min(view.local_blocks, request.num_blocks)
        beyond_gpu = local - min(view.gpu_blocks, local)
        # The disk part is the local prefix's tail: a request shorter than the prefix reads less of it.
        disk = min(max(0, view.disk_blocks - (view.local_blocks - local)), beyond_gpu)
        swap_s = c.block_bytes * ((beyond_gpu - disk) / c.host_bytes_per_s
                                  + disk / (view.disk_bytes_per_s or c.disk_bytes_per_s))
        pull_blocks, pull_s = 0, 0.0
        if holder is not None and holder.blocks > local:
            k = min(holder.blocks, request.num_blocks) - local
            t = self.pull_time(k, holder.bytes_per_s, holder.latency_s) * holder.time_factor
            # Pull only when it beats recomputing the same tokens here.
            if t < k * request.block_tokens / rate:
                pull_blocks, pull_s = k, t
        tokens = request.prompt_tokens - (local + pull_blocks) * request.block_tokens
        prefill_s = tokens / rate
        # A slot's wait is not work on the node's cores (a mate's queue_time leaves it out).
        queue_s = self.queue_time(view, tokens) + seat_wait(view, c)
        work = queue_s + swap_s + pull_s + prefill_s
        shared_s = sum(min(w, work) for w in shared)  # each w already scaled by `sharing`
        return TTFTEstimate(work + shared_s, queue_s, swap_s, pull_s, prefill_s, pull_blocks, shared_s)
