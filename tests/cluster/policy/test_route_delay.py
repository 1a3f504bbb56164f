"""The `cost` policy prices the delay its extra work causes the requests queued where it runs (issue
35): a modest queue difference no longer pulls a request away from its cached prefix, while a busy
holder still loses its request to an idle or far less loaded peer."""

import dataclasses

import pytest

from radixmesh.cluster.policy.base import PolicyConfig, RouteRequest, make_policy
from radixmesh.cluster.policy.cost_model import delay_to_others
from radixmesh.cluster.policy.view import ClusterView, NodeView
from radixmesh.cluster.sim.config import SimConfig
from radixmesh.cluster.sim.simulator import Simulator
from radixmesh.proto.ids import NodeId
from tests.cluster.sim.test_sim_pending import conversations

# 10-token blocks at 100 tokens/s (0.1 s a block); pulls at 1 kB/s of 1 kB blocks (1 s a block), so
# a node without the prefix recomputes it: 0.4 s more work than on the holder of 4 blocks.
CFG = PolicyConfig(block_bytes=1000, pull_latency_s=0.0, pull_bytes_per_s=1000.0)
REQ = RouteRequest(prompt_tokens=50, num_blocks=5, block_tokens=10)
A, B = NodeId("a"), NodeId("b")


def node(name: NodeId, local: int = 0, *, queued: int = 0, inflight: int = 0, decodes: int = 0, rate: float = 100.0
         ) -> NodeView:
    return NodeView(name, local, local, queued, inflight, rate, held_blocks=local, running_decodes=decodes)


def test_the_delay_is_the_extra_work_times_n_n_plus_1_queued_plus_its_compute_once_per_decode() -> None:
    assert delay_to_others(node(A), 0.4, 0.4) == 0.0
    assert delay_to_others(node(A, inflight=1), 0.4, 0.4) == pytest.approx(0.8)
    assert delay_to_others(node(A, inflight=5), 0.4, 0.4) == pytest.approx(12.0)
    # 2 queued (0.4 x 2 x 3) and 3 decoding, each waiting once for the steps that compute the 0.4 s.
    assert delay_to_others(node(A, inflight=5, decodes=3), 0.4, 0.4) == pytest.approx(2.4 + 1.2)
    # A pull runs beside the forward: the decodes wait for none of it.
    assert delay_to_others(node(A, inflight=5, decodes=3), 0.4, 0.0) == pytest.approx(2.4)


def test_a_modest_queue_difference_keeps_the_request_with_its_cached_prefix() -> None:
    # a: 4 blocks cached behind 3 requests (3 s); b: no prefix behind 2 (1 s). Own TTFT 3.1 s on a,
    # 1.5 s on b, but b's 0.4 s of recompute delays its 2 queued 0.4 x 2 x 3 = 2.4 s: 3.9 s.
    cluster = ClusterView((node(A, 4, queued=300, inflight=3), node(B, queued=100, inflight=2)))
    d = make_policy("cost", CFG).route(REQ, cluster)
    assert (d.node, d.local_blocks, d.pull_from) == (A, 4, None)
    assert d.est_ttft_s == pytest.approx(3.1)
    assert "not b (ttft 1500.0 ms): 400.0 ms more work there, priced 2400.0 ms of others' waiting (2 queued, 0 decoding)" in (
        d.reason)


def test_a_heavily_loaded_holder_still_loses_its_request_to_an_idle_peer() -> None:
    # a: 10 s of queue; b idle: its recompute delays nobody, so own TTFT decides (0.5 s against 10.1 s).
    d = make_policy("cost", CFG).route(REQ, ClusterView((node(A, 4, queued=1000, inflight=5), node(B))))
    assert (d.node, d.local_blocks, d.pull_from) == (B, 0, None)
    assert d.reason.endswith("400.0 ms more work than the least, priced 0.0 ms of others' waiting (0 queued, 0 decoding)")
    # With a fast link b pulls the prefix instead: 4 ms on the wire more work than a's, still nobody
    # delayed.
    fast = make_policy("cost", dataclasses.replace(CFG, pull_bytes_per_s=1e6, step_tokens=10))
    d = fast.route(REQ, ClusterView((node(A, 4, queued=1000, inflight=5), node(B))))
    assert (d.node, d.pull_from, d.pull_blocks) == (B, A, 4)


def test_a_recompute_beside_running_decodes_is_priced_for_each_of_them() -> None:
    # a: 4 blocks cached behind 1 s of queue (2 requests); b: nothing queued, 10 requests decoding.
    # Own TTFT 1.1 s on a, 0.5 s on b (+ 0 for a queue b has not); but b's 0.4 s of recompute holds
    # each of its 10 decodes 0.4 s: 4 s of others' time, so the request stays with its prefix.
    cluster = ClusterView((node(A, 4, queued=100, inflight=2), node(B, inflight=10, decodes=10)))
    d = make_policy("cost", CFG).route(REQ, cluster)
    assert (d.node, d.local_blocks) == (A, 4)
    assert "priced 4000.0 ms of others' waiting (0 queued, 10 decoding)" in d.reason
    # Pulled over a fast link instead, b computes no more than a would: nothing held, b wins.
    fast = make_policy("cost", dataclasses.replace(CFG, pull_bytes_per_s=1e6, step_tokens=10))
    d = fast.route(REQ, cluster)
    assert (d.node, d.pull_from, d.pull_blocks) == (B, A, 4)


def test_a_far_busier_holder_loses_its_request_to_a_busy_peer() -> None:
    # a: 50 s behind 20 requests; b: 2 s behind 2. On b: 2 + 0.5 + 2.4 s of others' waiting < 50.1 s.
    cluster = ClusterView((node(A, 4, queued=5000, inflight=20), node(B, queued=200, inflight=2)))
    d = make_policy("cost", CFG).route(REQ, cluster)
    assert (d.node, d.local_blocks) == (B, 0)
    assert d.est_ttft_s == pytest.approx(2.5)


def test_on_an_overloaded_cluster_cost_keeps_the_hits_and_ttft_of_prefix_affinity() -> None:
    """Conversations on 2 nodes past their capacity (TTFT p50 ~30 s): every recompute a move to the
    shorter queue causes is work the whole cluster waits for. Pricing only each request's own TTFT,
    `cost` lost 1.1 points of hit rate and 9% of p50 TTFT to prefix affinity here (0.697, 30.6 s
    against 0.708, 28.0 s)."""
    requests = conversations(count=60, per_s=0.5)
    config = SimConfig(nodes=2, capacity_blocks=1000, prefill_tokens_per_s=800.0)
    cost = Simulator(config).run(requests)
    affinity = Simulator(dataclasses.replace(config, policy="prefix_affinity")).run(requests)
    assert cost.hit_rate >= affinity.hit_rate - 0.002, (cost.hit_rate, affinity.hit_rate)
    assert cost.ttft_p50_s <= affinity.ttft_p50_s, (cost.ttft_p50_s, affinity.ttft_p50_s)


def test_nodes_that_would_do_the_same_work_are_charged_no_extra_whatever_their_measured_rates() -> None:
    # Both hold 4 blocks: each would prefill the same 10 tokens. a measured 5% slower (95 tokens/s)
    # but has the shorter queue: own TTFT 1.1 s against b's 3.1 s. Compared in seconds across nodes,
    # a's 10 tokens at its rate were 5.3 ms more than b's, times 20 x 21 queued there: 2.2 s of
    # "others' waiting" for work b would do just the same, and the request went to b's longer queue.
    cluster = ClusterView((node(A, 4, queued=95, inflight=20, rate=95.0), node(B, 4, queued=300, inflight=3)))
    d = make_policy("cost", CFG).route(REQ, cluster)
    assert (d.node, d.local_blocks) == (A, 4)
    assert d.est_ttft_s == pytest.approx(105 / 95)
    assert "more work" not in d.reason
    # Real extra work is still charged at the node's own rate: b without the prefix recomputes 40
    # tokens more than a would there, 0.4 s, times 3 x 4 queued.
    cluster = ClusterView((node(A, 4, queued=300, inflight=3, rate=95.0), node(B, queued=100, inflight=3)))
    d = make_policy("cost", CFG).route(REQ, cluster)
    assert d.node == A and "not b (ttft 1500.0 ms): 400.0 ms more work there, priced 4800.0 ms" in d.reason
