"""The cost model's prices: tier reads, pulls, step floors, running decodes and cores shared with a
compute group's mates (cluster/policy/cost_model.py)."""

import dataclasses

import pytest

from radixmesh.cluster.policy.base import RouteRequest, make_policy
from radixmesh.cluster.policy.cost_model import CostModel, Holder, seat_wait
from radixmesh.cluster.policy.view import ClusterView, NodeView
from radixmesh.proto.ids import NodeId
from tests.support.policy_views import CFG, REQ, A, B, C, view


def test_cost_model_without_pull_when_the_link_is_slow() -> None:
    est = CostModel(CFG).estimate(REQ, view(A, 2, gpu=1, queued=100), Holder(B, 4, 1000.0))
    # queue 1 s + host swap-in of 1 block 1 s + no pull (2 s > 0.2 s recompute) + prefill 30 tokens 0.3 s
    assert est.pull_blocks == 0
    assert est.total_s == pytest.approx(2.3)


def test_cost_model_reads_the_disk_tail_at_the_node_s_disk_rate() -> None:
    # 4 local blocks: 1 on gpu, 1 from host (1 s), 2 from disk at the node's measured 500 B/s (4 s).
    measured = dataclasses.replace(view(A, 4, gpu=1), disk_blocks=2, disk_bytes_per_s=500.0)
    assert CostModel(CFG).estimate(REQ, measured, None).swap_s == pytest.approx(5.0)
    # Not measured: the configured default (250 B/s: 8 s).
    default = dataclasses.replace(measured, disk_bytes_per_s=0.0)
    assert CostModel(dataclasses.replace(CFG, disk_bytes_per_s=250.0)).estimate(REQ, default, None).swap_s == (
        pytest.approx(9.0))
    # A request of 3 blocks stops inside the disk tail: 1 host block, 1 disk block.
    short = RouteRequest(prompt_tokens=30, num_blocks=3, block_tokens=10)
    assert CostModel(CFG).estimate(short, measured, None).swap_s == pytest.approx(3.0)
    with pytest.raises(ValueError, match="disk_blocks"):
        dataclasses.replace(measured, disk_blocks=4)


def test_cost_model_pulls_when_cheaper() -> None:
    est = CostModel(CFG).estimate(REQ, view(A, 2, gpu=1, queued=100), Holder(B, 4, 1e6))
    assert est.pull_blocks == 2
    assert (est.queue_s, est.swap_s) == (pytest.approx(1.0), pytest.approx(1.0))
    assert est.pull_s == pytest.approx(0.002) and est.prefill_s == pytest.approx(0.1)


def test_a_measured_step_floor_prices_every_step_a_request_waits_for() -> None:
    """A busy holder of the whole prompt, four short requests queued: per token alone its queue was
    40 tokens (40 ms here), so it looked nearly idle; with its floor measured each of those steps costs
    50 ms more, and the request waits for the step in progress too."""
    holder = NodeView(A, 5, 5, queued_tokens=40, inflight=4, prefill_tokens_per_s=1000.0, held_blocks=5)
    model = CostModel(CFG)
    assert model.estimate(REQ, holder, None).total_s == pytest.approx(0.04)
    measured = dataclasses.replace(holder, step_floor_s=0.05)
    # 4 steps of 10 queued tokens (CFG.step_tokens) and their floors, half the step in progress.
    assert model.estimate(REQ, measured, None).total_s == pytest.approx(0.04 + 4 * 0.05 + 0.5 * (0.05 + 0.01))
    # An idle node with the prompt cached still runs one step to give the first token.
    idle = NodeView(B, 5, 5, prefill_tokens_per_s=1000.0, held_blocks=5, step_floor_s=0.05)
    assert model.estimate(REQ, idle, None).total_s == pytest.approx(0.05)


def test_running_decodes_delay_the_queue_by_one_pass_per_step() -> None:
    busy, idle = view(A, 4, decodes=8), view(B, 4)
    model = CostModel(CFG)
    # 10 tokens to prefill, one step: a pass of 32 + 8 tokens' time at 100 tokens/s.
    assert model.estimate(REQ, busy, None).queue_s == pytest.approx(0.4)
    assert model.estimate(REQ, idle, None).queue_s == 0.0
    assert make_policy("cost", CFG).route(REQ, ClusterView((busy, idle))).node == B


def test_nodes_sharing_cores_are_priced_as_sharing_them() -> None:
    # a is busy (10 s of queue); b and c are idle, b on a's cores. A prefix-less request takes 0.5 s
    # on c, 0.5 s + min(10 s, 0.5 s) on b.
    nodes = (view(A, queued=1000, group="host"), view(B, group="host"), view(C))
    model = CostModel(CFG)
    assert model.estimate(REQ, nodes[1], None, [10.0]).total_s == pytest.approx(1.0)
    d = make_policy("cost_no_pull", CFG).route(REQ, ClusterView(nodes))
    assert d.node == C
    alone = make_policy("cost_no_pull", CFG).route(REQ, ClusterView(nodes[:2]))
    assert alone.node == B and alone.est_ttft_s == pytest.approx(1.0) and "cores shared" in alone.reason


def test_an_idle_mate_with_a_measured_floor_shares_nothing() -> None:
    # Both measured a 0.1 s floor; an idle mate's queue_time is one step (a new request's), which
    # it does not run: charged as sharing, it made every node of a host look a step slower.
    idle = [dataclasses.replace(view(n, group="host"), step_floor_s=0.1) for n in (A, B)]
    model = CostModel(CFG)
    assert model.mates_work(idle)(idle[0]) == []
    busy = dataclasses.replace(idle[1], inflight=1, queued_tokens=10)
    assert model.mates_work([idle[0], busy])(idle[0]) == [pytest.approx(model.queue_time(busy))]


def test_mates_whose_compute_shares_fit_the_cores_share_nothing() -> None:
    # Two one-thread agents on a 2-core box were priced as sharing: the router's TTFT estimates were
    # 2x pessimistic whenever both were busy (realized / estimated 0.45-0.49 past the knee).
    model = CostModel(CFG)

    def busy(n: NodeId, share: float) -> NodeView:
        return dataclasses.replace(view(n, queued=100, group="host"), inflight=1, compute_share=share)

    halves = [busy(A, 0.5), busy(B, 0.5)]
    assert model.mates_work(halves)(halves[0]) == []  # 0.5 + 0.5 fit the cores
    wholes = [busy(A, 1.0), busy(B, 1.0)]
    assert model.mates_work(wholes)(wholes[0]) == [pytest.approx(model.queue_time(wholes[1]))]
    unknown = [busy(A, 0.0), busy(B, 0.5)]  # an agent that did not say: priced as the whole group
    assert model.mates_work(unknown)(unknown[1]) == [pytest.approx(model.queue_time(unknown[0]))]
    # three half shares on the cores: each stream runs at 1/1.5 speed, x + 0.25 x (w1 + w2) for w >= x
    thirds = [busy(A, 0.5), busy(B, 0.5), busy(C, 0.5)]
    assert model.mates_work(thirds)(thirds[0]) == [pytest.approx(0.25 * model.queue_time(u)) for u in thirds[1:]]


def test_a_request_waits_for_a_sequence_slot_on_a_node_running_its_engines_cap() -> None:
    """A holder of the whole prompt with nothing to prefill: below its engine's cap a new request runs at
    once; at the cap it waits for the k-th of the running requests to end, k / (cap + 1) of their mean
    decode time (uniform residuals); unknown cap or no decode measured yet: not priced."""
    cfg = dataclasses.replace(CFG, max_seqs=4)
    model = CostModel(cfg)
    below = NodeView(A, 5, 5, inflight=3, prefill_tokens_per_s=100.0, held_blocks=5, running_decodes=3,
                     decode_s=5.0)
    assert model.estimate(REQ, below, None).queue_s == pytest.approx(CostModel(CFG).estimate(REQ, below, None).queue_s)
    at_cap = dataclasses.replace(below, inflight=4, running_decodes=4)
    # 1 of 4 slots must free: 1/5 of 5 s, on top of the decode passes CostModel(CFG) prices already.
    assert model.estimate(REQ, at_cap, None).queue_s - CostModel(CFG).estimate(REQ, at_cap, None).queue_s == (
        pytest.approx(1.0))
    beyond = dataclasses.replace(below, inflight=10, running_decodes=4)
    assert seat_wait(beyond, cfg) == pytest.approx(7 / 5 * 5.0)
    assert seat_wait(dataclasses.replace(beyond, decode_s=0.0), cfg) == 0.0
    assert seat_wait(beyond, dataclasses.replace(cfg, max_seqs=0)) == 0.0
    # Not work on the node's cores: a compute-group mate's share leaves the slot wait out.
    assert model.queue_time(beyond) == pytest.approx(CostModel(CFG).queue_time(beyond))
    with pytest.raises(ValueError, match="max_seqs"):
        dataclasses.replace(CFG, max_seqs=-1)
    with pytest.raises(ValueError, match="decode_s"):
        dataclasses.replace(below, decode_s=float("nan"))


def test_cost_pulls_a_hot_prefix_to_an_idle_node_when_its_holder_runs_full() -> None:
    """A holder of a hot document at its sequence cap (every prompt cached, so its prefill queue is
    empty) against an idle peer: cost pulls the document there; prefix affinity, which sees no queued
    tokens, stays; with the cap unknown cost stays too (the slot wait is what moved it)."""
    cfg = dataclasses.replace(CFG, max_seqs=8)
    hot = NodeView(A, 5, 5, inflight=12, prefill_tokens_per_s=100.0, held_blocks=5, running_decodes=8,
                   decode_s=4.0, step_floor_s=0.05)
    # Pulling the document takes 0.1 s on this pair: more than the holder's 0.075 s of steps.
    cluster = ClusterView((hot, NodeView(B, prefill_tokens_per_s=100.0, step_floor_s=0.05)),
                          pull_bytes_per_s={(B, A): 5e4})
    d = make_policy("cost", cfg).route(REQ, cluster)
    assert (d.node, d.pull_from, d.pull_blocks) == (B, A, 5)
    assert make_policy("prefix_affinity", cfg).route(REQ, cluster).node == A
    assert make_policy("cost", dataclasses.replace(cfg, max_seqs=0)).route(REQ, cluster).node == A
