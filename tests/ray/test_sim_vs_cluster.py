"""The simulator and the real local cluster agree on hit rate for a small trace replay.

Same trace slice (the first 60 requests of the Mooncake arXiv trace, prompts cut to 24 blocks), same policy
(`cost`), same nodes (3) and the same per-node cache capacity in blocks, one trace block = one
cluster block. Both run the requests one after another (the simulator with arrivals far apart), so
neither sees queueing the other does not. Tolerance: 0.05 absolute block hit rate. The one
systematic difference is bounded by it: the real engine always recomputes the block holding a
prompt's last token, the simulator counts a fully cached prompt as all hits.
"""

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import ray

from radixmesh.cluster.launch import launcher
from radixmesh.cluster.launch.config import LauncherConfig
from radixmesh.cluster.sim.config import SimConfig
from radixmesh.cluster.sim.simulator import Simulator, prepare
from radixmesh.cluster.sim.trace import read_trace
from radixmesh.cluster.sim.trace_replay import ReplayConfig, fit, replay
from tests.support.router_cluster import SOURCE

pytestmark = [pytest.mark.ray, pytest.mark.anyio, pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(300)]
TRACE = Path(__file__).resolve().parents[1] / "data" / "traces" / "mooncake_trace_1000.jsonl"
NODES, CAPACITY, BS, TOLERANCE = 3, 48, 4, 0.05
REPLAY = ReplayConfig(block_size=BS, max_prompt_blocks=24, max_tokens=1, sequential=True, model="tiny-test")


@pytest.fixture(scope="module")
def local_ray() -> Iterator[LauncherConfig]:
    # Capacity plus room for the one running request's prompt and its decode block.
    config = LauncherConfig(local_nodes=NODES, model=SOURCE, block_size=BS,
                            gpu_blocks=CAPACITY + REPLAY.max_prompt_blocks + 2, heartbeat_interval_s=0.2,
                            publish_interval_s=0.01, model_name="tiny-test")
    launcher.init_local_ray(config)
    yield config
    ray.shutdown()


async def test_simulator_and_cluster_agree_on_hit_rate(local_ray: LauncherConfig) -> None:
    trace = fit(read_trace(TRACE, limit=60), REPLAY)
    spaced = [replace(r, arrival_s=1000.0 * i) for i, r in enumerate(prepare(trace, REPLAY.mapping))]
    sim = Simulator(SimConfig(nodes=NODES, capacity_blocks=CAPACITY, policy="cost")).run(spaced)

    deployment = await launcher.up(local_ray)
    try:
        real = await replay(deployment.router_url, trace, REPLAY)
    finally:
        assert await launcher.down()
    assert real.requests == sim.requests == len(trace)
    assert real.infinite_bound == pytest.approx(sim.infinite_bound)
    assert 0.2 < sim.hit_rate  # the slice shares enough to make the comparison mean something
    assert abs(real.block_hit_rate - sim.hit_rate) <= TOLERANCE, (real.as_dict(), sim.as_dict())
