"""The router `up` configures: a modeled deployment prices the pulls of pairs it has not measured yet at
its profile's link, sped up like every other wait."""

import pytest

from radixmesh.cluster.launch.config import LauncherConfig
from radixmesh.cluster.policy.base import PolicyConfig
from radixmesh.node_agent import parse_engine
from radixmesh.proto.ids import NodeId


def test_a_modeled_deployment_prices_unmeasured_pulls_at_its_profile_s_link() -> None:
    engine = parse_engine("modeled:h100-llama3-8b", speedup=0.02)
    assert engine is not None
    router = LauncherConfig(modeled=engine).router_config("layout", block_bytes=engine.wire_block_bytes(16))
    assert router.policy_config.pull_bytes_per_s == pytest.approx(40e9 * 0.02)  # 40 GB/s, slowed 50x
    real = LauncherConfig().router_config("layout", 4096)
    assert real.policy_config.pull_bytes_per_s == PolicyConfig().pull_bytes_per_s


def test_the_router_admits_and_prices_the_agents_engine_batch() -> None:
    """Both the router's running slots per node and the cost model's sequence cap are the agents'
    engine's max_num_seqs: a router admitting fewer left part of every batch empty."""
    launcher = LauncherConfig()
    seqs = launcher.agent_config(NodeId("node-0"), "127.0.0.1:1", "127.0.0.1").engine.max_num_seqs
    router = launcher.router_config("layout", 4096)
    assert router.policy_config.max_seqs == seqs
    assert router.admission.max_running_per_node == seqs
