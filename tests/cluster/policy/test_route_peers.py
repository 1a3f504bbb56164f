"""Pull peers (ClusterView.peers, issue 37): nodes a request may pull from but never go to, as a
split cluster's decode agents while a prompt is routed among its prefill agents."""

import random

import pytest

from radixmesh.cluster.policy.base import make_policy
from radixmesh.cluster.policy.inflight import InflightTable
from radixmesh.cluster.policy.pending_index import PendingIndex
from radixmesh.cluster.policy.step import RoutingStep
from radixmesh.cluster.policy.view import ClusterView
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.ids import NodeId
from radixmesh.proto.metadata.messages import MatchResult, NodeMatch
from radixmesh.proto.metadata.nodes import NodeLoad
from tests.support.policy_views import CFG, REQ, A, B, C, view


def test_the_cost_policy_pulls_from_a_peer_it_may_not_choose() -> None:
    d = make_policy("cost", CFG).route(REQ, ClusterView((view(A), view(B)), peers=(view(C, 4),)))
    assert d.node in (A, B) and (d.pull_from, d.pull_blocks) == (C, 4)


def test_a_peer_is_no_candidate_twice() -> None:
    with pytest.raises(ValueError, match="twice"):
        ClusterView((view(A),), peers=(view(A, 4),))


def test_the_routing_step_makes_holding_peers_pull_peers_and_leaves_the_others_out() -> None:
    clock = [0.0]
    step = RoutingStep(make_policy("cost", CFG, random.Random(0)), PendingIndex(5.0, lambda: clock[0]),
                       InflightTable(lambda: clock[0]), block_tokens=10, default_prefill_tokens_per_s=100.0)
    hashes = [BlockHash(bytes([i]) * 16) for i in range(5)]
    match = MatchResult(4, (NodeMatch(C, "127.0.0.1:3", 4, 4, 4, NodeLoad()),))
    d_node = NodeId("d")  # a peer that holds nothing of the prompt: not in the view
    routed = step.route(hashes, 50, match, [A, B, C, d_node], peers=frozenset({C, d_node}), record=False)
    assert routed.decision.node in (A, B) and routed.decision.pull_from == C
    assert [v.node for v in routed.view.cluster.nodes] == [A, B]
    assert [v.node for v in routed.view.cluster.peers] == [C] and routed.view.addresses[C] == "127.0.0.1:3"
    excluded = step.route(hashes, 50, match, [A, B, C], peers=frozenset({C}), exclude=frozenset({C}), record=False)
    assert excluded.view.cluster.peers == () and excluded.decision.pull_from is None
