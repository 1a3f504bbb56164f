"""Routing policies' choices, bounded load and the registry (the cost model's prices are in
test_cost_model.py, the pending index in test_route_pending.py)."""

import dataclasses
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixmesh.cluster.policy.base import (
    PolicyConfig,
    RouteRequest,
    make_policy,
    policy_names,
    within_load_cap,
)
from radixmesh.cluster.policy.view import ClusterView, NodeView
from radixmesh.proto.ids import NodeId
from tests.support.policy_views import CFG, REQ, A, B, C, D, view


def asking(tokens: int, blocks: int = 0, block_tokens: int = 10) -> RouteRequest:
    """A request of `tokens` prompt tokens whose first `blocks` blocks nodes may hold."""
    return RouteRequest(tokens, blocks, block_tokens)


def test_cost_prefers_the_holder_when_idle() -> None:
    d = make_policy("cost", CFG).route(REQ, ClusterView((view(A, 4), view(B))))
    assert (d.node, d.local_blocks, d.pull_from, d.pull_blocks) == (A, 4, None, 0)
    assert d.est_ttft_s == pytest.approx(0.1)


def test_cost_pulls_to_an_idle_node_when_the_holder_is_busy() -> None:
    cluster = ClusterView((view(A, 4, queued=1000, inflight=1), view(B)))
    d = make_policy("cost", CFG).route(REQ, cluster)
    assert (d.node, d.local_blocks, d.pull_from, d.pull_blocks) == (B, 0, A, 4)
    # 4 ms on the wire (a's busy engine does not hold the pull up), 100 ms to prefill the last block
    assert d.est_ttft_s == pytest.approx(0.104)
    assert "pulled from a" in d.reason


def test_cost_prices_pulls_at_what_they_realized() -> None:
    nodes = (view(A, 4, queued=1000, inflight=1), view(B))
    # Pulls took twice their wire time: 8 ms, still well under recomputing 4 blocks (0.4 s).
    d = make_policy("cost", CFG).route(REQ, ClusterView(nodes, pull_time_factor=2.0))
    assert (d.node, d.pull_from, d.pull_blocks, d.est_ttft_s) == (B, A, 4, pytest.approx(0.108))
    # 200 times: 0.8 s, more than recomputing them: b recomputes.
    d = make_policy("cost", CFG).route(REQ, ClusterView(nodes, pull_time_factor=200.0))
    assert (d.node, d.pull_from, d.est_ttft_s) == (B, None, pytest.approx(0.5))


def test_cost_uses_the_measured_pair_bandwidth() -> None:
    nodes = (view(A, 4, queued=1000, inflight=1), view(B))
    slow = ClusterView(nodes, pull_bytes_per_s={(B, A): 1000.0})
    d = make_policy("cost", CFG).route(REQ, slow)
    assert (d.node, d.pull_from, d.est_ttft_s) == (B, None, pytest.approx(0.5))


def test_cost_no_pull_never_pulls() -> None:
    cluster = ClusterView((view(A, 4, queued=1000, inflight=1), view(B)))
    d = make_policy("cost_no_pull", CFG).route(REQ, cluster)
    assert (d.node, d.pull_from, d.pull_blocks) == (B, None, 0)


def test_requests_in_flight_are_not_a_load_cap() -> None:
    # Equal recent work: a queue of 3 requests at a (which a cap on requests in flight,
    # ceil(1.25 x 5 / 3) = 3, would refuse) does not exclude it; queueing there is the cost model's call.
    nodes = (view(A, inflight=3, recent=90.0), view(B, recent=90.0), view(C, inflight=1, recent=90.0))
    assert [v.node for v in within_load_cap(nodes, 0.25, asking(50))] == [A, B, C]


def test_recent_work_cap_exact() -> None:
    nodes = tuple(NodeView(n, recent_tokens=w) for n, w in zip((A, B, C, D), (300.0, 100.0, 0.0, 150.0)))
    # in flight all 0; work cap = 1.25 * (550 + 50) / 4 = 187.5: a (350) and d (200) are out
    assert [v.node for v in within_load_cap(nodes, 0.25, asking(50))] == [B, C]


def test_below_the_floor_work_is_not_load() -> None:
    # 1 s of prefill at 100 tokens/s: a (40 + 50 <= 100) fits under the floor despite its share.
    nodes = (
        NodeView(A, recent_tokens=40.0, prefill_tokens_per_s=100.0),
        NodeView(B, prefill_tokens_per_s=100.0),
    )
    assert [v.node for v in within_load_cap(nodes, 0.25, asking(50), 1.0)] == [A, B]
    assert [v.node for v in within_load_cap(nodes, 0.25, asking(50), 0.0)] == [B]


def test_a_request_too_big_for_any_share_goes_to_the_least_recent_work() -> None:
    nodes = (
        NodeView(A, recent_tokens=10.0),
        NodeView(B, recent_tokens=5.0),
        NodeView(C, recent_tokens=5.0, inflight=1),
    )
    # work cap 1.25 * (20 + 1000) / 3 = 425 < 1005: b and c tie on least work; c's request in
    # flight does not exclude it.
    assert [v.node for v in within_load_cap(nodes, 0.25, asking(1000))] == [B, C]


def test_cost_leaves_an_idle_holder_with_too_much_recent_work() -> None:
    # The holder has nothing in flight (no count at this instant would refuse it) but took most of
    # the recent work: the request goes to b and pulls the prefix instead.
    nodes = (view(A, 4, recent=400.0), view(B))
    d = make_policy("cost", CFG).route(REQ, ClusterView(nodes))
    assert (d.node, d.pull_from, d.pull_blocks) == (B, A, 4)


def test_prefix_affinity_skips_a_node_over_the_cap() -> None:
    nodes = (view(A, 5, recent=300.0), view(B, 2, recent=200.0), view(C, 1, recent=200.0), view(D, recent=200.0))
    d = make_policy("prefix_affinity", CFG).route(REQ, ClusterView(nodes))
    # cap = max(1.25 * (900 + 50) / 4, floor 2 s x 100 tokens/s) = 296.9: a (350) is out, b (250) in
    assert (d.node, d.local_blocks) == (B, 2)
    # cap = 1.25 * (800 + 50) / 4 = 265.6: now a (250) is within it, though 3 requests are in flight
    within = tuple(view(n, loc, inflight=3 if n == A else 0, recent=200.0) for n, loc in zip((A, B, C, D), (5, 2, 1, 0)))
    d = make_policy("prefix_affinity", CFG).route(REQ, ClusterView(within))
    assert (d.node, d.local_blocks) == (A, 5)


def test_round_robin_cycles_and_least_loaded_picks_fewest_tokens() -> None:
    cluster = ClusterView((view(A, queued=5), view(B, queued=1), view(C, queued=9)))
    rr = make_policy("round_robin", CFG)
    assert [rr.route(REQ, cluster).node for _ in range(4)] == [A, B, C, A]
    assert make_policy("least_loaded", CFG).route(REQ, cluster).node == B


def test_registry_names_and_unknown_policy() -> None:
    assert policy_names() == ["cost", "cost_no_pull", "least_loaded", "prefix_affinity", "round_robin"]
    with pytest.raises(ValueError, match="valid: cost, cost_no_pull"):
        make_policy("random")


@pytest.mark.parametrize(
    "build",
    [
        lambda: ClusterView(()),
        lambda: ClusterView((view(A), view(A))),
        lambda: NodeView(A, 3, 2),
        lambda: NodeView(A, prefill_tokens_per_s=0.0),
        lambda: RouteRequest(prompt_tokens=10, num_blocks=2, block_tokens=10),
        lambda: PolicyConfig(load_eps=-0.1),
        lambda: PolicyConfig(load_half_life_s=0.0),
        lambda: PolicyConfig(load_floor_s=-1.0),
        lambda: NodeView(A, recent_tokens=-1.0),
        lambda: NodeView(A, recent_tokens=math.inf),
    ],
)
def test_bad_inputs_raise_value_error(build: object) -> None:
    with pytest.raises(ValueError):
        build()  # type: ignore[operator]


views_st = st.lists(
    st.tuples(
        st.integers(0, 5), st.integers(0, 4), st.sampled_from([0, 0, 20, 60, 2000]),
        st.sampled_from([50.0, 100.0, 400.0]), st.integers(0, 5), st.sampled_from([0, 0, 3]),
        st.sampled_from([0.0, 0.0, 0.3]), st.sampled_from(["", "", "h1", "h2"]), st.sampled_from([0.0, 0.0, 0.02, 0.4]),
        st.sampled_from([0.0, 0.5, 1.0]),
    ),
    min_size=1,
    max_size=6,
).map(
    lambda rows: tuple(
        NodeView(NodeId(f"n{i}"), loc, loc, q, inf, r, held_blocks=min(held, loc), running_decodes=dec, pulling_s=pull,
                 compute_group=group, step_floor_s=floor, compute_share=share)
        for i, (loc, inf, q, r, held, dec, pull, group, floor, share) in enumerate(rows)
    )
)
"""Nodes with computed and pending prefixes, queues, decodes, pulls in progress, shared cores (with
unknown, half and whole shares of them) and measured step floors."""


@settings(max_examples=60, deadline=None)
@given(
    nodes=views_st,
    work=st.lists(st.sampled_from([0.0, 10.0, 37.5, 200.0]), min_size=6, max_size=6),
    eps=st.sampled_from([0.0, 0.25, 1.0]),
    tokens=st.sampled_from([0, 50, 5000]),
    floor_s=st.sampled_from([0.0, 1.0]),
)
def test_load_cap_matches_its_formula(
    nodes: tuple[NodeView, ...], work: list[float], eps: float, tokens: int, floor_s: float
) -> None:
    nodes = tuple(dataclasses.replace(v, recent_tokens=w) for v, w in zip(nodes, work, strict=False))
    request = asking(tokens, tokens // 10)

    def computes(v: NodeView) -> int:
        """What `v` would compute of the prompt: the tokens past its cached prefix."""
        return tokens - min(v.local_blocks, tokens // 10) * 10

    total = sum(v.recent_tokens for v in nodes)
    by_work = [
        v
        for v in nodes
        if v.recent_tokens + computes(v) <= max((1 + eps) * (total + computes(v)) / len(nodes),
                                                floor_s * v.prefill_tokens_per_s) + 1e-6
    ]
    least = min(v.recent_tokens for v in nodes)
    expect = by_work or [v for v in nodes if v.recent_tokens == least]
    assert within_load_cap(nodes, eps, request, floor_s) == expect
    # Requests in flight never change eligibility: only recent work does.
    idle = tuple(dataclasses.replace(v, inflight=0) for v in nodes)
    assert [v.node for v in within_load_cap(idle, eps, request, floor_s)] == [v.node for v in expect]


def test_a_holder_is_charged_only_what_it_would_compute() -> None:
    # A cached 1,536-token document in a cluster that computes little: charged the whole prompt,
    # every node was over the cap (1.25 x (340 + 1,540) / 4 = 587.5 < 1,540 + 40) and the request
    # went to the least recently worked node, which recomputed the document. Charged its 4 uncached
    # tokens, the holder fits (104 <= 1.25 x 344 / 4 = 107.5).
    holder, other = NodeView(A, 96, 96, recent_tokens=100.0), NodeView(B, recent_tokens=40.0)
    rest = (NodeView(C, recent_tokens=100.0), NodeView(D, recent_tokens=100.0))
    doc = asking(1540, 96, block_tokens=16)
    assert [v.node for v in within_load_cap((holder, other, *rest), 0.25, doc)] == [A]


@settings(max_examples=60, deadline=None)
@given(nodes=views_st, bw=st.sampled_from([1e3, 1e5, 1e7]), seed=st.integers(0, 3))
def test_every_policy_decides_within_the_view(nodes: tuple[NodeView, ...], bw: float, seed: int) -> None:
    cluster = ClusterView(nodes)
    config = dataclasses.replace(CFG, pull_bytes_per_s=bw)
    eligible = within_load_cap(nodes, CFG.load_eps, REQ, CFG.load_floor_s)
    for name in policy_names():
        d = make_policy(name, config, random.Random(seed)).route(REQ, cluster)
        chosen = next(v for v in nodes if v.node == d.node)
        assert d.local_blocks == min(chosen.local_blocks, REQ.num_blocks)
        assert d.local_blocks + d.pull_blocks <= REQ.num_blocks
        if name in ("prefix_affinity", "cost", "cost_no_pull"):
            assert chosen in eligible
        if d.pull_from is not None:
            assert name == "cost" and d.pull_from != d.node and d.pull_blocks > 0
            holder = next(v for v in nodes if v.node == d.pull_from)
            # Never from blocks the holder has not computed yet.
            assert d.local_blocks + d.pull_blocks <= holder.held_blocks


def _oracle_step(u: NodeView) -> float:
    """One engine step of `u` for CFG (step_tokens 10, decode pass 32 tokens)."""
    chunk = min(10, u.queued_tokens) / u.prefill_tokens_per_s
    if u.step_floor_s:
        return u.step_floor_s + chunk
    return chunk + ((32 + u.running_decodes) / u.prefill_tokens_per_s if u.running_decodes else 0.0)


def _oracle_ttft(v: NodeView, nodes: tuple[NodeView, ...], bw: float, latency: float) -> tuple[float, int, float]:
    """The cost model written out by hand for REQ (block_tokens 10, block_bytes 1000, no host tier
    part): (TTFT, blocks pulled, pull seconds) of REQ on `v`, pulling from the other node that
    computed the most."""
    rate = v.prefill_tokens_per_s
    local = min(v.local_blocks, 5)
    others = [o for o in nodes if o.node != v.node and o.held_blocks > 0]
    pulled = 0
    if others:
        best = max(others, key=lambda o: o.held_blocks)  # first of the longest
        k = min(best.held_blocks, 5) - local
        # the holder's pins run beside its forward: however busy, it does not hold the pull up
        if k > 0 and latency + k * 1000 / bw < k * 10 / rate:
            pulled = k
    pull_s = latency + pulled * 1000 / bw if pulled else 0.0
    tokens = 50 - (local + pulled) * 10

    def ahead(u: NodeView, own: int) -> float:
        steps = max(1, -(-(u.queued_tokens + own) // 10))
        if u.step_floor_s:
            # every step's floor, and the step in progress when the node is busy
            fixed = steps * u.step_floor_s + (0.5 * _oracle_step(u) if u.inflight else 0.0)
        else:
            fixed = steps * (32 + u.running_decodes) / u.prefill_tokens_per_s if u.running_decodes else 0.0
        return u.queued_tokens / u.prefill_tokens_per_s + u.pulling_s + fixed

    work = ahead(v, tokens) + pull_s + tokens / rate
    mates = [u for u in nodes if v.compute_group and u.compute_group == v.compute_group and u.node != v.node]
    # an idle mate shares nothing (its one step in `ahead` would be a new request's)
    busy = [u for u in mates if u.inflight or u.queued_tokens or u.running_decodes or u.pulling_s]
    shares = [v.compute_share, *(u.compute_share for u in busy)]
    # busy shares that fit the cores slow nobody; beyond them each is slowed by the total demand
    f = 1.0 if not all(shares) else min(1.0, (max(1.0, sum(shares)) - 1.0) / len(busy)) if busy else 0.0
    return work + sum(min(f * ahead(u, 0), work) for u in busy), pulled, pull_s


@settings(max_examples=300, deadline=None)
@given(nodes=views_st, bw=st.sampled_from([1e3, 1e5, 1e7]), latency=st.sampled_from([0.0, 0.025, 0.3]),
       margin=st.sampled_from([0.0, 0.05, 0.7]))
def test_cost_is_the_brute_force_minimum(nodes: tuple[NodeView, ...], bw: float, latency: float, margin: float
                                         ) -> None:
    config = dataclasses.replace(CFG, pull_bytes_per_s=bw, pull_latency_s=latency)

    eligible = within_load_cap(nodes, CFG.load_eps, REQ, CFG.load_floor_s)

    def tokens(u: NodeView) -> int:
        """REQ's prompt tokens `u` prefills (no host tier part here)."""
        return 50 - (min(u.local_blocks, 5) + _oracle_ttft(u, nodes, bw, latency)[1]) * 10

    def pull(u: NodeView) -> float:
        _, pulled, seconds = _oracle_ttft(u, nodes, bw, latency)
        return seconds if pulled else 0.0

    def compute(v: NodeView, u: NodeView | None = None) -> float:
        """The prefill of `u`'s plan (default: `v`'s own) at `v`'s prefill rate."""
        return tokens(u or v) / v.prefill_tokens_per_s

    def work(v: NodeView, u: NodeView | None = None) -> float:
        """The pull and prefill of `u`'s plan (default: `v`'s own) on `v`."""
        return pull(u or v) + compute(v, u)
    longest = max(min(v.local_blocks, 5) for v in eligible)

    def score(v: NodeView) -> float:
        ttft, pulled, _ = _oracle_ttft(v, nodes, bw, latency)
        computing = max((o.local_blocks for o in nodes if o.node != v.node and o.local_blocks > o.held_blocks),
                        default=0)
        duplicate = max(0, min(computing, 5) - min(v.local_blocks, 5) - pulled)
        # The extra work's delay to the requests queued there: n (n + 1) x the extra seconds; and its
        # extra compute, once for each request decoding there.
        n = max(0, v.inflight - v.running_decodes)
        # Extra: beyond the cheapest plan any eligible candidate has, priced at `v`'s own rate.
        least = min(work(v, u) for u in eligible)
        least_compute = min(compute(v, u) for u in eligible)
        delay = (work(v) - least) * n * (n + 1) + (compute(v) - least_compute) * v.running_decodes
        # Leaving part of the longest cached prefix behind must buy more than the margin.
        left = min(v.local_blocks, 5) + pulled < longest
        return ttft + duplicate * 10 / v.prefill_tokens_per_s + delay + margin * left

    d = make_policy("cost", config).route(REQ, ClusterView(nodes, move_margin_s=margin))
    best = min(score(v) for v in eligible)
    # Within the margin of the best, scores are ties: a node keeping the longest prefix first, then
    # the fewest waiting for their prefill, then the fewest in flight, then the best score.
    near = [v for v in eligible if score(v) <= (best + margin) * (1 + 1e-9)]

    def rank(v: NodeView) -> tuple[bool, int, int]:
        leaves = min(v.local_blocks, 5) + _oracle_ttft(v, nodes, bw, latency)[1] < longest
        return leaves, max(0, v.inflight - v.running_decodes), v.inflight

    first = min(rank(v) for v in near)
    chosen = next(v for v in eligible if v.node == d.node)
    assert chosen in near and rank(chosen) == first
    assert score(chosen) == pytest.approx(min(score(v) for v in near if rank(v) == first))
    assert d.est_ttft_s == pytest.approx(_oracle_ttft(chosen, nodes, bw, latency)[0])


# --- measured prices -------------------------------------------------------------------------------
# SmolLM2-135M float32, 16-token blocks: 30 layers x 3 KV heads x 64 dims x K,V x 4 bytes x 16 tokens.
SMOL_BLOCK_BYTES = 30 * 3 * 64 * 2 * 4 * 16
SMOL = RouteRequest(prompt_tokens=64, num_blocks=4, block_tokens=16)


def test_default_prices_recompute_a_short_prefix_rather_than_pull_it() -> None:
    # Before any measurement a pull of 4 blocks is priced 3 ms + 2.9 MB / 2.5 GB/s = 4.2 ms; at 20k
    # tokens/s they recompute in 3.2 ms, so the holder's blocks are recomputed on the idle node.
    holder, idle = NodeView(A, 4, 4, queued_tokens=20000, prefill_tokens_per_s=20000.0, held_blocks=4), NodeView(
        B, prefill_tokens_per_s=20000.0)
    d = make_policy("cost", PolicyConfig(block_bytes=SMOL_BLOCK_BYTES)).route(SMOL, ClusterView((holder, idle)))
    assert (d.node, d.pull_from, d.pull_blocks) == (B, None, 0)
    # The old prices (10 GB/s, 2 ms) would have pulled: 2.3 ms < 3.2 ms.
    old = PolicyConfig(block_bytes=SMOL_BLOCK_BYTES, pull_latency_s=0.002, pull_bytes_per_s=10e9)
    assert make_policy("cost", old).route(SMOL, ClusterView((holder, idle))).pull_from == A


def test_a_measured_fixed_cost_per_pair_prices_the_pull() -> None:
    nodes = (view(A, 4, queued=1000, inflight=1), view(B), view(C, 4, queued=1000, inflight=1))
    # b's pulls from a took 0.5 s before the first byte: recomputing 4 blocks (0.4 s) is cheaper.
    slow = ClusterView(nodes, pull_latency_s={(B, A): 0.5})
    d = make_policy("cost", CFG).route(REQ, slow)
    assert (d.node, d.pull_from, d.pull_blocks) == (B, None, 0)
    assert make_policy("cost", CFG).route(REQ, ClusterView(nodes)).pull_from == A


def test_no_pull_from_a_holder_still_computing_the_blocks() -> None:
    # a was just routed the prefix (pending, not computed) behind a long queue: b must not plan a
    # pull that would get nothing; it computes, paying for the duplicate (a is slower still).
    pending = view(A, 4, queued=1000, inflight=1, held=0)
    d = make_policy("cost", CFG).route(REQ, ClusterView((pending, view(B))))
    assert (d.node, d.pull_from, d.pull_blocks) == (B, None, 0)
    assert "4 blocks another node is computing" in d.reason
    # The same holder with the blocks computed is pulled from.
    done = view(A, 4, queued=1000, inflight=1)
    assert make_policy("cost", CFG).route(REQ, ClusterView((done, view(B)))).pull_from == A


def test_the_second_request_of_a_prefix_goes_where_the_first_computes_it() -> None:
    # a will compute the 4-block prefix (its 50-token prompt queued): 0.5 s + 0.1 s there, 0.5 s on
    # idle b, but b would prefill the 4 blocks a second time (0.4 s of duplicate work).
    pending = view(A, 4, queued=50, inflight=1, held=0)
    d = make_policy("cost", CFG).route(REQ, ClusterView((pending, view(B))))
    assert (d.node, d.local_blocks, d.pull_from) == (A, 4, None)
    assert d.est_ttft_s == pytest.approx(0.6)


def test_a_move_off_the_longest_prefix_must_buy_more_than_the_margin() -> None:
    # a holds 3 of 5 blocks behind 20 queued tokens: 0.2 + 0.2 s there; idle b computes all 5: 0.5 s;
    # c holds 3 blocks behind 5 tokens: 0.05 + 0.2 = 0.25 s. With no pulls (NoPulls) c buys 0.15 s
    # over a by queue alone, without leaving anything behind (both hold 3 blocks): no margin applies.
    nodes = (view(A, 3, queued=20, inflight=1), view(B), view(C, 3, queued=5, inflight=1))
    assert make_policy("cost_no_pull", CFG).route(REQ, ClusterView(nodes, move_margin_s=1.0)).node == C
    # b's 5-block recompute (0.5 s) would beat a holder 0.35 s behind its queue by 0.05 s: without a
    # margin the router leaves the holder, with a margin above the gain it stays.
    busy, idle = view(A, 3, queued=35, inflight=1), view(B)
    gone = make_policy("cost_no_pull", CFG).route(REQ, ClusterView((busy, idle)))
    assert gone.node == B and gone.longest_ttft_s == pytest.approx(0.55)
    kept = make_policy("cost_no_pull", CFG).route(REQ, ClusterView((busy, idle), move_margin_s=0.06))
    assert (kept.node, kept.local_blocks, kept.longest_ttft_s) == (A, 3, None)
    # A gain beyond the margin still moves, and says so.
    moved = make_policy("cost_no_pull", CFG).route(REQ, ClusterView((view(A, 3, queued=100, inflight=1), idle),
                                                                    move_margin_s=0.06))
    assert moved.node == B and "60.0 ms margin" in moved.reason




def test_scores_within_the_margin_go_to_the_holder_with_fewer_waiting_then_fewer_in_flight() -> None:
    # Both hold the whole prompt: a has 2 requests waiting; b none waiting and 4 decoding.
    a, b = view(A, 5, queued=10, inflight=2), view(B, 5, queued=5, inflight=4, decodes=4)
    # Within a 5 s margin the scores are not told apart: the fewer waiting takes it, though b has more
    # in flight (by score alone, requests herd onto whichever node's lagging measurements look best).
    assert make_policy("cost", CFG).route(REQ, ClusterView((a, b), move_margin_s=5.0)).node == B
    # As many waiting (none): the fewer in flight, so decode batches do not pile up on one holder.
    c = view(C, 5, queued=10, inflight=1, decodes=1)
    assert make_policy("cost", CFG).route(REQ, ClusterView((b, c), move_margin_s=5.0)).node == C


def test_a_tie_within_the_margin_keeps_the_cached_prefix_before_fewer_in_flight() -> None:
    # Without pulls c, idle, would recompute all 5 blocks (0.5 s); a holds them behind 3 requests
    # (0.4 s). With a 2 s margin c's score (0.5 + 2 s for leaving the prefix) is within the margin of
    # a's, and c has fewer in flight; a still takes it.
    a, c = view(A, 5, queued=40, inflight=3), view(C)
    assert make_policy("cost_no_pull", CFG).route(REQ, ClusterView((a, c), move_margin_s=2.5)).node == A
