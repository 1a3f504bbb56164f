"""A prefix served from an agent's disk tier, through a router: the router's /stats document and its
usage figure (cached_tokens) count it as local_disk, a hit."""

import random
from pathlib import Path

import pytest

from radixmesh.cluster.fleet.agent_client import LocalAgentClient, StaticAgentDirectory
from radixmesh.cluster.observability.endpoints import stats_document
from radixmesh.cluster.policy.base import PolicyConfig
from radixmesh.cluster.router.router import Router
from radixmesh.node_agent.agent import NodeAgent
from radixmesh.node_agent.config import AgentConfig
from radixmesh.node_agent.engine.config import EngineConfig
from radixmesh.node_agent.memory.config import MemoryConfig
from radixmesh.proto.ids import NodeId
from tests.support.agents import SECRET, plan, prompt, reference
from tests.support.router_cluster import ManualClock, router_config
from tests.support.tiny_model import BS, SOURCE

pytestmark = [pytest.mark.anyio, pytest.mark.integration]
FULL = 5


async def test_router_stats_show_hits_read_back_from_disk(tmp_path: Path) -> None:
    engine = EngineConfig(block_size=BS, memory=MemoryConfig(num_gpu_blocks=8, num_host_blocks=8))
    agent = NodeAgent(AgentConfig(NodeId("a"), model=SOURCE, engine=engine, transfer="none", secret=SECRET,
                                  disk_cache=str(tmp_path), disk_cache_bytes=1 << 28))
    await agent.start()
    router = Router(router_config(agent.layout.fingerprint(), policy_config=PolicyConfig(block_bytes=agent.layout.block_bytes)),
                    StaticAgentDirectory([LocalAgentClient(agent)]), None, clock=ManualClock(), rng=random.Random(0))
    try:
        prompts = [prompt(60 + i, FULL * BS + 2) for i in range(6)]
        for i, p in enumerate(prompts):  # the later prompts push the first out of gpu and host, to disk
            await router.complete(plan(f"w{i}", p))
        agent.memory.flush_disk()
        again = await router.complete(plan("again", prompts[0]))
        assert again.result.output_token_ids == reference(prompts[0])
        assert again.result.stats.tokens.local_disk == FULL * BS and again.cached_tokens == FULL * BS
        doc = stats_document(router.metrics, None, policy="cost", active_policy="cost", metadata_available=False,
                             inflight={})
        stats = doc["router"]
        assert isinstance(stats, dict)
        assert stats["local_disk"] == FULL * BS and stats["local_host"] == 0
        assert stats["nodes"][NodeId("a")]["local_disk"] == FULL * BS
        router.check_invariants()
    finally:
        await router.close()
        await agent.stop()
