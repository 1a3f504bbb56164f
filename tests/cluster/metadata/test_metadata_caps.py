"""A node holds at most the blocks it declared (capacity_blocks, plus a small slack) in the global
index: a batch or snapshot past that is refused whole, counted, and changes nothing (issue 28,
finding 8: a node declaring 10 blocks indexed 491,520)."""

import asyncio
from dataclasses import replace

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixmesh.cluster.metadata.index import GlobalIndex
from radixmesh.cluster.metadata.service import MetadataService
from radixmesh.cluster.metadata.service_config import LimitExceeded, ServiceConfig, ServiceLimits
from radixmesh.common.metadata.client import MetadataClient
from radixmesh.node_agent.agent import NodeAgent
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.events import AllCleared, BlockRemoved, BlockStored, CacheEvent, Tier
from radixmesh.proto.ids import NodeId
from radixmesh.proto.metadata.messages import EventBatch, NodeSnapshot, PublishStatus
from radixmesh.proto.metadata.nodes import NodeInfo
from tests.support.agents import agent_config
from tests.support.servers import start_metadata_server

L = "layout-caps"
A = NodeId("a")


def h(i: int) -> BlockHash:
    return BlockHash(i.to_bytes(16, "big"))


def stored(lo: int, hi: int, tier: Tier = Tier.GPU) -> BlockStored:
    """One chain of blocks lo..hi-1."""
    return BlockStored(tuple(h(i) for i in range(lo, hi)), None, tier)


def service(capacity: int, slack: int = 0) -> MetadataService:
    s = MetadataService(config=ServiceConfig(limits=ServiceLimits(capacity_slack_blocks=slack)))
    s.register(NodeInfo(A, 1, L, 16, 4096, "x", capacity))
    return s


def test_a_node_declaring_10_blocks_cannot_hold_1000_in_the_index() -> None:
    s = MetadataService()  # the default slack
    s.register(NodeInfo(A, 1, L, 16, 4096, "x", 10))
    cap = 10 + s.config.limits.capacity_slack_blocks
    seq = 0
    for first in range(0, 1000, 100):
        batch = EventBatch(A, 1, seq + 1, (stored(first, first + 100),))
        if s.index.node_block_count(A) + 100 <= cap:
            assert s.publish(batch).status is PublishStatus.OK
            seq += 1
        else:
            with pytest.raises(LimitExceeded, match="capacity_blocks 10"):
                s.publish(batch)
    assert s.index.node_block_count(A) == 500  # not 1,000
    assert s.over_capacity_refusals == 5
    assert s.membership.get(A).last_seq == 5  # type: ignore[union-attr]
    s.check_invariants()


def test_a_refused_batch_changes_nothing() -> None:
    s = service(capacity=4)
    s.publish(EventBatch(A, 1, 1, (stored(0, 3),)))
    before = s.index.node_chains(A), s.feed.seq
    with pytest.raises(LimitExceeded):
        s.publish(EventBatch(A, 1, 2, (BlockRemoved((h(0),), Tier.GPU), stored(10, 13))))
    assert (s.index.node_chains(A), s.feed.seq) == before and len(s.index) == 3
    assert s.publish(EventBatch(A, 1, 2, (stored(10, 11),))).next_seq == 3  # the same seq, within the cap
    s.check_invariants()


def test_a_full_node_may_evict_and_store_in_one_batch() -> None:
    s = service(capacity=10)
    s.publish(EventBatch(A, 1, 1, (stored(0, 10),)))
    # Steady state of an honest full node: as many removed as stored.
    s.publish(EventBatch(A, 1, 2, (BlockRemoved(tuple(h(i) for i in range(5)), Tier.GPU), stored(20, 25))))
    # A block it holds on gpu, now on host too, is still one block.
    s.publish(EventBatch(A, 1, 3, (stored(20, 25, Tier.HOST),)))
    assert s.index.node_block_count(A) == 10
    with pytest.raises(LimitExceeded):
        s.publish(EventBatch(A, 1, 4, (stored(30, 31),)))
    s.publish(EventBatch(A, 1, 4, (AllCleared(), stored(40, 50))))  # a reset, then full again
    assert s.index.node_block_count(A) == 10 and s.over_capacity_refusals == 1
    s.check_invariants()


def test_a_snapshot_past_the_capacity_is_refused_and_changes_nothing() -> None:
    s = service(capacity=10, slack=2)
    s.publish(EventBatch(A, 1, 1, (stored(0, 5),)))
    with pytest.raises(LimitExceeded):
        s.sync_snapshot(NodeSnapshot(A, 1, 9, (stored(100, 113),)))
    assert s.index.node_block_count(A) == 5 and s.membership.get(A).last_seq == 1  # type: ignore[union-attr]
    # The same 12 blocks on both tiers are 12 blocks: within 10 + 2.
    s.sync_snapshot(NodeSnapshot(A, 1, 9, (stored(100, 112), stored(100, 112, Tier.HOST))))
    assert s.index.node_block_count(A) == 12 and s.over_capacity_refusals == 1
    s.check_invariants()


def test_an_undeclared_capacity_is_capped_by_the_snapshot_limit() -> None:
    s = MetadataService(config=ServiceConfig(limits=ServiceLimits(max_snapshot_blocks=50, capacity_slack_blocks=0)))
    s.register(NodeInfo(A, 1, L, 16, 4096, "x", 0))
    s.publish(EventBatch(A, 1, 1, (stored(0, 50),)))
    with pytest.raises(LimitExceeded):
        s.publish(EventBatch(A, 1, 2, (stored(50, 51),)))


def test_the_refusal_is_resource_exhausted_on_the_wire() -> None:
    async def body() -> None:
        server, port = await start_metadata_server(service(capacity=3))
        try:
            async with MetadataClient(f"127.0.0.1:{port}", timeout_s=5.0) as client:
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await client.publish([EventBatch(A, 1, 1, (stored(0, 4),))])
                assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
                assert "capacity_blocks 3" in (refused.value.details() or "")
        finally:
            await server.stop(None)
        assert server.service.over_capacity_refusals == 1 and len(server.service.index) == 0

    asyncio.run(body())


EVENTS = st.lists(
    st.one_of(
        st.builds(lambda i, t: BlockStored((h(i),), None, t), st.integers(0, 7), st.sampled_from(Tier)),
        st.builds(lambda hs, t: BlockRemoved(tuple(map(h, hs)), t), st.lists(st.integers(0, 7), max_size=3),
                  st.sampled_from(Tier)),
        st.just(AllCleared()),
    ),
    max_size=12,
)


@settings(max_examples=200, deadline=None)
@given(before=EVENTS, batch=EVENTS)
def test_held_after_is_what_applying_the_batch_leaves(before: list[CacheEvent], batch: list[CacheEvent]) -> None:
    index = GlobalIndex()
    index.add_node(A, L)
    index.add_node(NodeId("b"), L)  # another holder of the same blocks: its bits must not count
    index.apply(NodeId("b"), [BlockStored((h(i),), None, Tier.HOST) for i in range(8)])
    index.apply(A, before)
    predicted = index.held_after(A, batch)
    index.apply(A, batch)
    assert predicted == index.node_block_count(A)
    index.check_invariants()


def test_an_agent_declares_the_blocks_of_both_tiers() -> None:
    """The index counts what either tier caches, so that is the capacity an honest agent declares."""
    config = agent_config("a")
    memory = replace(config.engine.memory, num_gpu_blocks=96, num_host_blocks=40)
    agent = NodeAgent(replace(config, engine=replace(config.engine, memory=memory)))

    async def body() -> None:
        await agent.start()
        try:
            assert agent.node_info().capacity_blocks == 136
        finally:
            await agent.stop()

    asyncio.run(body())
