"""The router `up` configures: a modeled deployment prices the pulls of pairs it has not measured yet at
its profile's link, sped up like every other wait."""

import pytest

from radixmesh.cluster.launch.config import LauncherConfig
from radixmesh.cluster.policy.base import PolicyConfig
from radixmesh.node_agent import parse_engine


def test_a_modeled_deployment_prices_unmeasured_pulls_at_its_profile_s_link() -> None:
    engine = parse_engine("modeled:h100-llama3-8b", speedup=0.02)
    assert engine is not None
    router = LauncherConfig(modeled=engine).router_config("layout", block_bytes=engine.wire_block_bytes(16))
    assert router.policy_config.pull_bytes_per_s == pytest.approx(40e9 * 0.02)  # 40 GB/s, slowed 50x
    real = LauncherConfig().router_config("layout", 4096)
    assert real.policy_config.pull_bytes_per_s == PolicyConfig().pull_bytes_per_s
