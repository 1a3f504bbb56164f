"""Which memory pulled KV bytes travel through (transfer.memory_path), and that the agent says it."""

import pytest
import torch

from radixmesh.common.secret import ClusterSecret
from radixmesh.node_agent.agent import NodeAgent
from radixmesh.node_agent.config import AgentConfig
from radixmesh.node_agent.engine.config import EngineConfig
from radixmesh.node_agent.memory.config import MemoryConfig
from radixmesh.node_agent.model.source import random_source
from radixmesh.node_agent.transfer.handshake import NodeIdentity
from radixmesh.node_agent.transfer.memory_path import MemoryPath, memory_path
from radixmesh.node_agent.transfer.plane import transport_by_name
from radixmesh.proto.ids import NodeId

CUDA = torch.device("cuda", 0)


def test_the_path_follows_the_pool_device_and_ucx_cuda_support() -> None:
    def never() -> frozenset[str]:
        raise AssertionError("a host pool needs no UCX query")

    assert memory_path(torch.device("cpu"), never) is MemoryPath.HOST
    assert memory_path(CUDA, lambda: frozenset({"tcp", "self", "cuda_copy", "cuda_ipc"})) is MemoryPath.CUDA_DIRECT
    assert memory_path(CUDA, lambda: frozenset({"tcp", "self"})) is MemoryPath.CUDA_STAGED
    assert memory_path(CUDA, frozenset) is MemoryPath.CUDA_STAGED  # the Ray object store: host only
    assert [p.staged for p in MemoryPath] == [False, False, True]


def test_the_ray_transport_moves_host_memory_only() -> None:
    identity = NodeIdentity(ClusterSecret.generate(), NodeId("n"))
    assert transport_by_name("ray", identity).active_transports() == frozenset()


@pytest.mark.anyio
async def test_an_agent_exports_its_memory_path() -> None:
    engine = EngineConfig(block_size=4, memory=MemoryConfig(num_gpu_blocks=32))
    agent = NodeAgent(AgentConfig(NodeId("m"), model=random_source("tiny"), engine=engine, transfer="ucx",
                                  secret=ClusterSecret.generate()))
    await agent.start()
    try:
        text = await agent.prometheus_text()
    finally:
        await agent.stop()
    want = MemoryPath.HOST if not torch.cuda.is_available() else None
    if want is not None:
        assert f'radixmesh_transfer_memory_path{{model_name="tiny",node="m",path="{want}"}} 1' in text
    else:
        assert "radixmesh_transfer_memory_path{" in text
