"""`--gpu-memory-utilization`: how the gpu tier is sized from a device's memory (the arithmetic here;
the measurement itself runs in bench/gpu_check.py on a lent GPU), and its refusal on the CPU."""

import pytest
import torch

from radixmesh.node_agent.agent import NodeAgent
from radixmesh.node_agent.config import AgentConfig
from radixmesh.node_agent.engine.config import EngineConfig
from radixmesh.node_agent.engine.gpu_budget import GpuBudget, measure_gpu_budget
from radixmesh.proto.ids import NodeId
from tests.support.tiny_model import tiny_model

GIB = 1 << 30


def test_the_share_less_weights_and_activations_is_cut_into_blocks() -> None:
    budget = GpuBudget(total_bytes=80 * GIB, free_bytes=70 * GIB, utilization=0.5, weights_bytes=16 * GIB,
                       activation_peak_bytes=2 * GIB, block_bytes=2 << 20)
    assert budget.kv_bytes == 22 * GIB and budget.num_blocks == 22 * 512
    assert "11264 KV blocks" in budget.describe()


def test_no_agent_takes_more_than_is_free_nor_less_than_nothing() -> None:
    shared = GpuBudget(80 * GIB, free_bytes=10 * GIB, utilization=0.9, weights_bytes=GIB,
                       activation_peak_bytes=GIB, block_bytes=GIB)
    assert shared.num_blocks == 10  # another agent on the same GPU holds the rest
    starved = GpuBudget(80 * GIB, 70 * GIB, utilization=0.1, weights_bytes=8 * GIB, activation_peak_bytes=GIB,
                        block_bytes=GIB)
    assert (starved.kv_bytes, starved.num_blocks) == (0, 0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusal")
def test_on_the_cpu_the_utilization_is_refused_with_what_to_use_instead() -> None:
    model = tiny_model(seed=0)
    with pytest.raises(ValueError, match="runs on the CPU: size its pool with gpu blocks"):
        measure_gpu_budget(model, EngineConfig(), torch.device("cpu"), 0.5)


@pytest.mark.parametrize("utilization", [0.0, -0.1, 1.5, float("nan")])
def test_an_agent_config_refuses_a_utilization_outside_0_1(utilization: float) -> None:
    with pytest.raises(ValueError, match="gpu_memory_utilization must be in"):
        AgentConfig(NodeId("n"), gpu_memory_utilization=utilization)


@pytest.mark.anyio
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusal")
async def test_an_agent_on_the_cpu_with_a_utilization_refuses_to_start() -> None:
    agent = NodeAgent(AgentConfig(NodeId("n"), transfer="none", gpu_memory_utilization=0.9))
    with pytest.raises(ValueError, match="runs on the CPU"):
        await agent.start()
    await agent.stop()
