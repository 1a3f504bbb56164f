"""Compute-free cluster simulator: the production GlobalIndex, PrefixCache/BlockPool eviction and
routing policies, driven by a trace on simulated time.

Per arrival: ask the index for each node's prefix, run the router's own routing step
(policy.step.RoutingStep), and queue the job on the chosen node, which prefills FIFO (tier reads,
then the pull, then the prefill). TTFT = prefill end - arrival; the hit rate is block-weighted by
source. What it models and what not: docs/routing.md#what-the-simulator-models.

`SimConfig(nodes=n, capacity_blocks=c)` is what `radixmesh up` runs (see SimConfig for what differs).
"""

import heapq
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

from radixmesh.cluster.metadata.index import GlobalIndex
from radixmesh.cluster.policy.base import make_policy
from radixmesh.cluster.policy.cost_model import CostModel
from radixmesh.cluster.policy.inflight import InflightTable
from radixmesh.cluster.policy.pending_index import PendingIndex
from radixmesh.cluster.policy.step import RoutingStep
from radixmesh.cluster.sim.config import LAYOUT as _LAYOUT
from radixmesh.cluster.sim.config import SimConfig
from radixmesh.cluster.sim.eviction_ages import EvictionAges, EvictionSummary, pooled_lru
from radixmesh.cluster.sim.holders import HolderCount
from radixmesh.cluster.sim.miss_causes import MissCauses
from radixmesh.cluster.sim.node import SecondChance, SimJob, SimNode
from radixmesh.cluster.sim.oracle import global_cache, infinite_bound
from radixmesh.cluster.sim.trace import TRACE_BLOCK_TOKENS, TokenMapping, TraceRequest
from radixmesh.common.prefix_cache.prefix_cache import EvictedBlock
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.ids import NodeId
from radixmesh.proto.metadata.messages import MatchResult, NodeMatch
from radixmesh.proto.metadata.nodes import NodeLoad

_DONE, _ARRIVE = 0, 1  # at equal times a finishing job inserts its blocks before the next routing
_NO_LOAD = NodeLoad()  # no heartbeats here: a view's prefill rate is the configured one
@dataclass(frozen=True, slots=True)
class SimRequest:
    """A trace request with its block hashes; prompt_tokens is rounded up to whole trace blocks."""

    arrival_s: float
    prompt_tokens: int
    hashes: tuple[BlockHash, ...]


@dataclass(frozen=True, slots=True)
class SimReport:
    """What one run measured; hit rates are fractions of all trace blocks."""

    config: SimConfig
    """What ran."""
    policy: str
    nodes: int
    capacity_blocks: int
    requests: int
    blocks: int
    hits_by_source: dict[str, int]
    misses_by_cause: dict[str, int]
    """Computed blocks by why no hit served them (`miss_causes.CAUSES`)."""
    evictions: dict[str, EvictionSummary]
    """Evicted blocks and their median age, by kind (`eviction_ages.KINDS`): where the nodes evict
    more last copies, and younger ones, than global LRU evicts blocks, partitioned memory is losing."""
    hit_rate: float
    infinite_bound: float
    global_lru: float
    """One LRU prefix cache of the cluster's total capacity (`oracle.global_cache`)."""
    global_same_eviction: float
    """One prefix cache of the cluster's total capacity with the nodes' eviction order: what
    routing costs against pooled memory, with eviction held equal."""
    max_load_over_mean: float
    """Most requests routed to one node / mean per node."""
    max_tokens_over_mean: float
    """Most prompt tokens routed to one node / mean per node (cached ones included)."""
    max_computed_over_mean: float
    """Most prompt tokens computed on one node / mean per node: the prefill work, which the load cap
    bounds (a node routed many tokens it holds does little for them)."""
    ttft_p50_s: float
    ttft_p99_s: float
    route_us_mean: float
    """Wall time of index match + pending match + policy decision per request (this machine)."""
    match_us_mean: float
    """Wall time of the GlobalIndex match alone per request."""

    def as_dict(self) -> dict[str, object]:
        d = {k: getattr(self, k) for k in self.__slots__}  # type: ignore[attr-defined]
        d["config"] = self.config.as_dict()
        d["evictions"] = {k: v._asdict() for k, v in self.evictions.items()}
        d["achieved_over_bound"] = self.hit_rate / self.infinite_bound if self.infinite_bound else 0.0
        d["achieved_over_global_lru"] = self.hit_rate / self.global_lru if self.global_lru else 0.0
        return d


def prepare(trace: Sequence[TraceRequest], mapping: TokenMapping | None = None) -> list[SimRequest]:
    """Hash every request once (the slow part), so several runs can share the result."""
    m = mapping or TokenMapping()
    return [SimRequest(r.arrival_s, len(r.hash_ids) * TRACE_BLOCK_TOKENS, tuple(m.hashes(r))) for r in trace]


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]); 0.0 for no values."""
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


class _NodeLoads:
    """What a simulated router's views read per node: queues from the nodes (the nodes' truth, not the
    router's InflightTable), recent work from the router's own table."""

    def __init__(self, sim: "Simulator", step: RoutingStep) -> None:
        self._sim, self._step = sim, step

    def queued_tokens(self, node: NodeId) -> int:
        return self._sim.nodes[node].queued_tokens(self._sim.now)

    def inflight(self, node: NodeId) -> int:
        return self._sim.nodes[node].inflight

    def recent_tokens(self, node: NodeId) -> float:
        return self._step.table.recent_tokens(node)

    def running_decodes(self, node: NodeId) -> int:
        return 0  # decode is not modelled

    def decode_s(self, node: NodeId) -> float:
        return 0.0  # decode is not modelled: no sequence slot waits

    def pulling_s(self, node: NodeId) -> float:
        """The waiting jobs' planned pulls (the current job's rest is in `queued_tokens`)."""
        return sum(job.decision.pull_s for job in self._sim.nodes[node].waiting)


class Simulator:
    """Replays requests through the policy over `config.nodes` virtual nodes. One run per instance."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.now = 0.0
        # The cluster's ghost as long as the cluster has blocks (cluster_recall).
        self.index = GlobalIndex(config.nodes * config.capacity_blocks if config.cluster_recall else 0)
        policy_config = config.policy_config
        self.policy = make_policy(config.policy, policy_config, random.Random(config.seed))
        def pending() -> PendingIndex:
            return PendingIndex(config.pending_ttl_s, clock=lambda: self.now, max_hold_s=config.pending_max_s)

        shared = pending()
        self._routers: list[RoutingStep] = []
        """Each router's routing state and step (its pending holders, recent work and policy)."""
        for k in range(config.routers):
            step = RoutingStep(
                self.policy if k == 0 else make_policy(config.policy, policy_config, random.Random(config.seed + k)),
                shared if config.shared_pending or k == 0 else pending(),
                InflightTable(lambda: self.now, config.load_half_life_s),
                block_tokens=TRACE_BLOCK_TOKENS,
                default_prefill_tokens_per_s=config.prefill_tokens_per_s,
                least_loaded=config.candidates,
            )
            step.loads = _NodeLoads(self, step)
            self._routers.append(step)
        self.pending, self.recent = self._routers[0].pending, self._routers[0].table
        """Router 0's (the only one unless config.routers > 1); its table counts recent work only."""
        self.cost = CostModel(policy_config)
        self.nodes: dict[NodeId, SimNode] = {}
        self.holders = HolderCount()
        copies = self.holders.others if config.cluster_eviction else None
        for i in range(config.nodes):
            nid = NodeId(f"n{i:03d}")
            recalled = partial(self.index.recalled, _LAYOUT) if config.cluster_recall else None
            self.nodes[nid] = SimNode(nid, config.capacity_blocks, config.prefill_tokens_per_s, copies,
                                      config.eviction_window, config.eviction, self._evicted, recalled,
                                      SecondChance(config.host_blocks, config.disk_blocks))
            self.index.add_node(nid, _LAYOUT)
        self._node_ids = list(self.nodes)
        self.hits = {"local": 0, "remote": 0, "miss": 0}
        if config.host_blocks or config.disk_blocks:
            self.hits |= dict.fromkeys(SecondChance.SOURCES, 0)
        self._read_bytes_per_s = dict(zip(SecondChance.SOURCES, (config.host_bytes_per_s, config.disk_bytes_per_s)))
        self.misses = MissCauses(self.holders.holders)
        self.ttfts: list[float] = []
        self._ages = EvictionAges()
        self._route_s = 0.0
        self._match_s = 0.0
        self._events: list[tuple[float, int, int, int | NodeId]] = []
        self._seq = 0

    def share_recent_work(self) -> None:
        """Every router reads and records one recent-work table (load shared with no lag)."""
        for router in self._routers:
            router.table = self.recent

    def run(self, requests: Sequence[SimRequest]) -> SimReport:
        """Replay all requests to completion and report."""
        for i, r in enumerate(requests):
            self._push(r.arrival_s, _ARRIVE, i)
        arrivals = 0
        while self._events:
            t, kind, _, what = heapq.heappop(self._events)
            self.now = max(self.now, t)
            if kind == _ARRIVE:
                assert isinstance(what, int)
                self._ages.used(requests[what].hashes, requests[what].arrival_s)
                self._arrive(what, requests[what])
                arrivals += 1
                if self.config.check_every and arrivals % self.config.check_every == 0:
                    self.check_invariants()
            else:
                assert isinstance(what, str)
                self._finish(self.nodes[NodeId(what)])
        self.check_invariants()
        return self._report(requests)

    def _push(self, t: float, kind: int, what: int | NodeId) -> None:
        self._seq += 1
        heapq.heappush(self._events, (t, kind, self._seq, what))

    def _arrive(self, i: int, r: SimRequest) -> None:
        t0 = time.perf_counter()
        found = self.index.match(_LAYOUT, r.hashes)
        self._match_s += time.perf_counter() - t0
        # The index's answer as Match gives it (in the index's order, not sorted longest first).
        match = MatchResult(found.cluster_blocks, tuple(
            NodeMatch(n, "", p.gpu, p.host, p.any_tier, _NO_LOAD) for n, p in found.prefixes.items()))
        router = self._routers[i % len(self._routers)]
        routed = router.route(r.hashes, r.prompt_tokens, match, self._node_ids, narrow=self.config.candidates > 0)
        self._route_s += time.perf_counter() - t0
        decision = routed.decision
        reused = decision.local_blocks + decision.pull_blocks
        est = r.prompt_tokens - reused * TRACE_BLOCK_TOKENS
        router.table.record_routed(decision.node, est)
        node = self.nodes[decision.node]
        node.enqueue(SimJob(i, r.arrival_s, r.prompt_tokens, r.hashes, decision, est, routed.hold))
        if node.current is None:
            self._start(node)

    def _start(self, node: SimNode) -> None:
        plan = node.waiting[0].decision
        peer = 0
        if plan.pull_from is not None:
            # As the real transfer source does: pin what the peer still holds, send, release. The
            # release renews those blocks' recency on the peer; the send itself takes no peer time here.
            source_node = self.nodes[plan.pull_from]
            source = source_node.cache
            hashes = node.waiting[0].hashes
            want = hashes[: plan.local_blocks + plan.pull_blocks]
            pinned = source.match(want)
            source.release(pinned)
            if self.config.handoff:
                source.pool.demote(pinned[node.cache.longest_prefix(hashes) :])
            # A peer still prefilling this prefix sends the part it has finished.
            computing = source_node.done_prefix(self.now, TRACE_BLOCK_TOKENS)
            peer = max(len(pinned), _common_prefix(want, computing))
        job = node.start_next(peer)
        self._apply_events(node)  # evictions made room for the new blocks
        reused = job.local_blocks + job.tier_blocks + job.pull_blocks
        computed = len(job.hashes) - reused
        self.hits["local"] += job.local_blocks
        self.hits["remote"] += job.pull_blocks
        self.hits["miss"] += computed
        for tier, n in job.tier_hits.items():
            self.hits[tier] += n
        self.misses.started(job.hashes[reused:])
        tokens = job.prompt_tokens - reused * TRACE_BLOCK_TOKENS
        node.computed_tokens += tokens
        pull_s = self.cost.pull_time(job.pull_blocks, self.config.pull_bytes_per_s)
        if plan.pull_from is not None and not job.pull_blocks:
            pull_s = self.config.pull_latency_s  # a pull that got nothing still paid its round trip
        read_s = sum(n * self.config.block_bytes / self._read_bytes_per_s[s] for s, n in job.tier_hits.items())
        node.compute_from = self.now + read_s + pull_s
        node.busy_until = node.compute_from + tokens / node.rate
        self._push(node.busy_until, _DONE, node.node)

    def _finish(self, node: SimNode) -> None:
        job = node.finish()
        self.misses.finished(job.hashes[job.local_blocks + job.tier_blocks + job.pull_blocks :])
        self._apply_events(node)
        if job.hold is not None:  # its first token: the router that routed it hears of it now
            self._routers[job.index % len(self._routers)].answered(job.hold)
        self.ttfts.append(self.now - job.arrival_s)
        if node.waiting:
            self._start(node)

    def _evicted(self, evicted: Sequence[EvictedBlock]) -> None:
        self._ages.node_evicted([e.hash for e in evicted], self.holders.holders, self.now)

    def _apply_events(self, node: SimNode) -> None:
        events = node.take_events()
        self.index.apply(node.node, events)
        self.holders.apply(events)

    def check_invariants(self) -> None:
        """Every node's cache and queue, the index (holding each node's blocks, every tier's), and
        the pending index."""
        for nid, node in self.nodes.items():
            node.check_invariants()
            indexed = self.index.node_block_count(nid)
            assert indexed == node.held_blocks(), f"{nid}: index holds {indexed} blocks, node {node.held_blocks()}"
        self.index.check_invariants()
        for router in self._routers:
            router.pending.check_invariants()
            router.table.check_invariants()

    def _report(self, requests: Sequence[SimRequest]) -> SimReport:
        prompts = [r.hashes for r in requests]
        blocks = sum(len(p) for p in prompts)
        assert sum(self.hits.values()) == blocks, f"hits {self.hits} do not add up to {blocks} blocks"
        routed = [n.routed for n in self.nodes.values()]
        mean = sum(routed) / len(routed)
        tokens = [n.routed_tokens for n in self.nodes.values()]
        mean_tokens = sum(tokens) / len(tokens)
        computed = [n.computed_tokens for n in self.nodes.values()]
        mean_computed = sum(computed) / len(computed)
        capacity = self.config.nodes * self.config.capacity_blocks
        global_lru, pooled = pooled_lru(prompts, [r.arrival_s for r in requests], capacity)
        return SimReport(
            config=self.config,
            policy=self.config.policy,
            nodes=self.config.nodes,
            capacity_blocks=self.config.capacity_blocks,
            requests=len(requests),
            blocks=blocks,
            hits_by_source=dict(self.hits),
            misses_by_cause=dict(self.misses.counts),
            evictions=self._ages.summary() | pooled,
            hit_rate=(blocks - self.hits["miss"]) / blocks if blocks else 0.0,
            infinite_bound=infinite_bound(prompts),
            global_lru=global_lru,
            global_same_eviction=(global_cache(prompts, capacity, self.config.eviction)
                                  if self.config.eviction != "lru" else global_lru),
            max_load_over_mean=max(routed) / mean if mean else 0.0,
            max_tokens_over_mean=max(tokens) / mean_tokens if mean_tokens else 0.0,
            max_computed_over_mean=max(computed) / mean_computed if mean_computed else 0.0,
            ttft_p50_s=percentile(self.ttfts, 50),
            ttft_p99_s=percentile(self.ttfts, 99),
            route_us_mean=self._route_s / len(requests) * 1e6 if requests else 0.0,
            match_us_mean=self._match_s / len(requests) * 1e6 if requests else 0.0,
        )


def _common_prefix(a: Sequence[BlockHash], b: Sequence[BlockHash]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
