"""Warm restart: an agent restarted over the same disk directory announces the blocks it finds there
to the metadata service under its new epoch, and serves them as local_disk hits, bit for bit."""

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from radixmesh.cluster.metadata.server import MetadataServer
from radixmesh.common.metadata.client import MetadataClient
from radixmesh.node_agent.agent import NodeAgent
from radixmesh.node_agent.config import AgentConfig
from radixmesh.node_agent.engine.config import EngineConfig
from radixmesh.node_agent.memory.config import MemoryConfig
from radixmesh.proto.block_hash import hash_blocks
from radixmesh.proto.events import Tier
from radixmesh.proto.ids import NodeId
from radixmesh.proto.metadata.messages import MatchQuery, NodeMatch
from tests.support.agents import SECRET, collect, plan, prompt, reference
from tests.support.servers import start_metadata_server
from tests.support.tiny_model import BS, SOURCE

pytestmark = [pytest.mark.anyio, pytest.mark.integration]
QUIET = 3600.0  # the publisher's loops run one round at start (register, snapshot), then stay quiet
FULL = 5
"""Full blocks of each prompt (plus a 2-token tail)."""


@pytest.fixture
async def metadata() -> AsyncIterator[tuple[MetadataServer, MetadataClient, str]]:
    server, port = await start_metadata_server()
    address = f"127.0.0.1:{port}"
    client = MetadataClient(address, timeout_s=5.0)
    yield server, client, address
    await client.close()
    await server.stop(0)


async def started(address: str, disk: Path, gpu: int = 8, host: int = 8) -> NodeAgent:
    """Agent "a" with gpu 8 / host 8 blocks by default (a prompt and its decode take 7) and a disk tier."""
    engine = EngineConfig(block_size=BS, memory=MemoryConfig(num_gpu_blocks=gpu, num_host_blocks=host))
    agent = NodeAgent(AgentConfig(NodeId("a"), model=SOURCE, engine=engine, transfer="none", secret=SECRET,
                                  metadata_address=address, heartbeat_interval_s=QUIET, publish_interval_s=QUIET,
                                  disk_cache=str(disk), disk_cache_bytes=1 << 28))
    await agent.start()
    return agent


async def indexed(client: MetadataClient, agent: NodeAgent, tokens: tuple[int, ...]) -> NodeMatch | None:
    [result] = await client.match([MatchQuery(agent.layout.fingerprint(), tuple(hash_blocks(tokens, BS)))])
    return next((n for n in result.nodes if n.node_id == agent.node), None)


async def test_a_restarted_agent_announces_its_disk_and_serves_from_it(
        metadata: tuple[MetadataServer, MetadataClient, str], tmp_path: Path) -> None:
    server, client, address = metadata
    prompts = [prompt(40 + i, FULL * BS + 2) for i in range(6)]
    first = await started(address, tmp_path)
    try:
        for i, p in enumerate(prompts):  # the later prompts push the first out of gpu and host, to disk
            await collect(first.serve(plan(f"w{i}", p)))
        first.memory.flush_disk()
        disk = first.memory.disk_stats()
        assert disk is not None and disk.disk_blocks >= FULL
    finally:
        await first.stop()  # gpu and host are gone with the process; the disk stays

    second = await started(address, tmp_path)
    try:
        assert second.epoch > first.epoch
        assert second.publisher is not None
        await second.publisher.flush()
        # The registration's snapshot announced the disk's blocks: the index counts a disk copy
        # on the node's host bit (priced like host), nothing on its gpu.
        held = await indexed(client, second, prompts[0])
        assert held is not None and (held.gpu_blocks, held.host_blocks, held.any_tier_blocks) == (0, 0, FULL)  # on disk only
        member = server.service.membership.get(NodeId("a"))
        assert member is not None and member.info.epoch == second.epoch
        disk = second.memory.disk_stats()
        assert disk is not None and server.service.index.node_block_count(NodeId("a")) == disk.disk_blocks

        deltas, result = await collect(second.serve(plan("again", prompts[0])))
        tokens = result.stats.tokens
        assert (tokens.local_gpu, tokens.local_host, tokens.local_disk) == (0, 0, FULL * BS)
        assert tuple(t for d in deltas for t in d.token_ids) == result.output_token_ids == reference(prompts[0])
    finally:
        await second.stop()


async def test_a_reset_clears_the_disk_tier_too_and_nothing_comes_back_after_a_restart(
        metadata: tuple[MetadataServer, MetadataClient, str], tmp_path: Path) -> None:
    """Issue 38 item 1: the reset used to clear gpu and host only; the disk kept serving the prompt."""
    server, _, address = metadata
    prompts = [prompt(40 + i, FULL * BS + 2) for i in range(6)]
    first = await started(address, tmp_path)
    try:
        for i, p in enumerate(prompts):
            await collect(first.serve(plan(f"w{i}", p)))
        assert first.publisher is not None
        first.memory.flush_disk()
        disk = first.memory.disk_stats()
        assert disk is not None and disk.disk_blocks >= FULL
        await first.publisher.flush()
        dropped = await first.reset_prefix_cache()
        after = first.memory.disk_stats()
        assert dropped["disk"] == disk.disk_blocks and after is not None and after.disk_blocks == 0
        assert list(tmp_path.glob("*.seg")) == []
        assert server.service.index.node_block_count(NodeId("a")) == 0  # the disk's removals were published
        _, result = await collect(first.serve(plan("after", prompts[0])))
        assert (result.stats.tokens.local_host, result.stats.tokens.local_disk) == (0, 0)
    finally:
        await first.stop()
    second = await started(address, tmp_path)
    try:
        assert second.memory.disk_stats() is not None
        # Only what was served after the reset can be here; prompts[1] was not.
        assert second.memory.cached_prefix(Tier.DISK, hash_blocks(prompts[1], BS)) == 0
        _, result = await collect(second.serve(plan("restarted", prompts[1])))
        assert result.stats.tokens.local_disk == 0
    finally:
        await second.stop()


async def test_a_clean_stop_keeps_what_gpu_and_host_held_so_a_restart_at_roomy_sizes_is_warm(
        metadata: tuple[MetadataServer, MetadataClient, str], tmp_path: Path) -> None:
    """Issue 40: blocks reached disk only when gpu and host both evicted them, so with pools that hold
    the whole workload a restart found 0 disk hits, as cold as a first start."""
    _, client, address = metadata
    prompts = [prompt(60 + i, FULL * BS + 2) for i in range(3)]
    first = await started(address, tmp_path, gpu=64, host=0)  # no host blocks (a staging host); nothing evicted
    try:
        for i, p in enumerate(prompts):
            await collect(first.serve(plan(f"w{i}", p)))
        disk = first.memory.disk_stats()
        assert disk is not None and disk.disk_writes == 0
    finally:
        await first.stop()  # a clean stop writes what the gpu caches

    second = await started(address, tmp_path, gpu=64, host=0)
    try:
        assert second.publisher is not None
        await second.publisher.flush()
        for i, p in enumerate(prompts):
            held = await indexed(client, second, p)
            assert held is not None and (held.gpu_blocks, held.any_tier_blocks) == (0, FULL)
            _, result = await collect(second.serve(plan(f"again{i}", p)))
            assert result.stats.tokens.local_disk == FULL * BS
            assert result.output_token_ids == reference(p)
    finally:
        await second.stop()


async def test_blocks_reaching_disk_are_indexed_without_waiting_for_a_new_registration(
        metadata: tuple[MetadataServer, MetadataClient, str], tmp_path: Path) -> None:
    """Issue 40: a block the host evicted to disk left the index until the node registered again."""
    server, client, address = metadata
    prompts = [prompt(80 + i, FULL * BS + 2) for i in range(6)]
    agent = await started(address, tmp_path)
    try:
        assert agent.publisher is not None
        await agent.publisher.flush()  # registered: later blocks travel only as events
        for i, p in enumerate(prompts):  # the later prompts push the first out of gpu and host, to disk
            await collect(agent.serve(plan(f"w{i}", p)))
        memory = agent.memory
        assert memory.disk_stats() is not None
        memory.flush_disk()
        await agent.publisher.flush()
        first_hashes = set(hash_blocks(prompts[0], BS))
        in_gpu_or_host = {h for s in memory.snapshot() if s.tier is not Tier.DISK for h in s.hashes}
        assert not first_hashes & in_gpu_or_host  # on disk only
        held = await indexed(client, agent, prompts[0])
        assert held is not None and (held.gpu_blocks, held.host_blocks, held.any_tier_blocks) == (0, 0, FULL)
        everywhere = {h for s in memory.snapshot() for h in s.hashes}  # all of a disk under ANNOUNCED_BLOCKS
        assert server.service.index.node_block_count(NodeId("a")) == len(everywhere)
    finally:
        await agent.stop()
