"""NodeMemory's demotion: gpu prefix blocks evicted by an allocation are copied to the host tier,
bit for bit, within the host's room, and never at the cost of the gpu allocation. And what its door
tells and does: blocks by state, cached prefixes per tier, eviction on demand, the disk's flush."""

from pathlib import Path

import pytest
import torch

from radixmesh.node_agent.engine.metrics import EngineCounters
from radixmesh.node_agent.engine.preemption import FixedPreemption
from radixmesh.node_agent.memory.config import MemoryConfig
from radixmesh.node_agent.memory.disk.tier import DiskConfig
from radixmesh.node_agent.memory.node_memory import NodeMemory
from radixmesh.node_agent.memory.sequence import PreemptMode
from radixmesh.node_agent.memory.tiers import HostTier
from radixmesh.proto.block_hash import hash_blocks
from radixmesh.proto.events import BlockRemoved, BlockStored, Tier
from radixmesh.proto.ids import BlockId
from radixmesh.proto.kv_layout import KVLayout

BS = 4
LAYOUT = KVLayout(model_id="t", num_layers=2, num_kv_heads=1, head_dim=4, dtype="float32", block_size=BS)
CHAIN = hash_blocks(list(range(4 * BS)), BS)  # 4 chained hashes


def memory(gpu: int, host: int, disk: DiskConfig | None = None) -> NodeMemory:
    config = MemoryConfig(num_gpu_blocks=gpu, num_host_blocks=host, disk=disk)
    return NodeMemory(LAYOUT, config, EngineCounters(), FixedPreemption(PreemptMode.SWAP))


def cache_chain(mem: NodeMemory) -> list[BlockId]:
    """CHAIN in gpu blocks filled with distinct values, released (cached, evictable)."""
    blocks = mem.gpu.pool.allocate(len(CHAIN))
    for i, b in enumerate(blocks):
        mem.gpu.kv[b] = float(i + 1)
    mem.gpu.cache.insert(CHAIN, blocks)
    mem.gpu.cache.release(blocks)
    mem.gpu.cache.take_events()
    return blocks


def test_evicted_chain_is_copied_to_the_host_and_stays_matchable_there() -> None:
    mem = memory(gpu=4, host=8)
    gpu_blocks = cache_chain(mem)
    want = mem.gpu.kv[gpu_blocks].clone()
    assert isinstance(mem.host, HostTier)
    got = mem.gpu.pool.allocate(4)  # evicts the whole chain, tail first
    assert sorted(got) == sorted(gpu_blocks)
    assert mem.counters.demoted_blocks == 4 and mem.gpu.cache.longest_prefix(CHAIN) == 0
    host_blocks = mem.host.cache.match(CHAIN)
    assert len(host_blocks) == 4
    assert torch.equal(mem.host.kv[host_blocks], want)
    # One BlockStored for the whole chain on the host, in chain order.
    assert mem.host.cache.take_events() == [BlockStored(tuple(CHAIN), None, Tier.HOST)]
    assert mem.gpu.cache.take_events() == [BlockRemoved(tuple(reversed(CHAIN)), Tier.GPU)]
    mem.host.cache.release(host_blocks)
    mem.gpu.pool.free(got)
    mem.check_invariants()


def test_a_full_host_takes_only_the_chain_head_and_a_pinned_host_takes_nothing() -> None:
    mem = memory(gpu=4, host=2)
    assert isinstance(mem.host, HostTier)
    cache_chain(mem)
    got = mem.gpu.pool.allocate(4)
    assert mem.counters.demoted_blocks == 2
    assert mem.host.cache.longest_prefix(CHAIN) == 2  # the head: the tail alone would never match
    mem.gpu.pool.free(got)
    held = mem.host.pool.allocate(2)  # every host block now in use: no room at all
    assert mem.host.cache.longest_prefix(CHAIN) == 0
    cache_chain(mem)
    got = mem.gpu.pool.allocate(4)  # the gpu allocation still succeeds; nothing is demoted
    assert len(got) == 4 and mem.counters.demoted_blocks == 2
    assert mem.host.pool.num_in_use == 2 and mem.host.pool.num_cached == 0
    mem.host.pool.free(held)
    mem.gpu.pool.free(got)
    mem.check_invariants()


def test_hashes_the_host_already_holds_are_not_copied_again() -> None:
    mem = memory(gpu=4, host=8)
    assert isinstance(mem.host, HostTier)
    cache_chain(mem)
    mem.gpu.pool.free(mem.gpu.pool.allocate(4))
    assert mem.counters.demoted_blocks == 4
    promoted = mem.gpu.pool.allocate(4)  # the same chain cached on the gpu again
    mem.gpu.cache.insert(CHAIN, promoted)
    mem.gpu.cache.release(promoted)
    mem.gpu.pool.free(mem.gpu.pool.allocate(4))
    assert mem.counters.demoted_blocks == 4 and mem.host.pool.num_cached == 4
    mem.check_invariants()


def test_block_counts_are_each_tiers_blocks_by_state() -> None:
    mem = memory(gpu=8, host=4)
    cache_chain(mem)
    held = mem.gpu.pool.allocate(3)  # takes the 4 free blocks' first 3: nothing cached is evicted
    assert mem.block_counts(Tier.GPU) == (1, 4, 3)
    assert mem.block_counts(Tier.HOST) == (4, 0, 0)
    assert memory(gpu=4, host=0).block_counts(Tier.HOST) == (0, 0, 0)  # no host tier
    with pytest.raises(ValueError, match="disk"):
        mem.block_counts(Tier.DISK)
    mem.gpu.pool.free(held)
    mem.check_invariants()


def test_evict_takes_the_chain_tail_first_down_to_the_host_and_cached_prefix_follows() -> None:
    mem = memory(gpu=4, host=8)
    cache_chain(mem)
    assert (mem.cached_prefix(Tier.GPU, CHAIN), mem.cached_prefix(Tier.HOST, CHAIN)) == (4, 0)
    assert mem.evict(Tier.GPU, 1) == 1
    # The tail went to the host, where without its head it matches nothing.
    assert (mem.cached_prefix(Tier.GPU, CHAIN), mem.cached_prefix(Tier.HOST, CHAIN)) == (3, 0)
    assert mem.block_counts(Tier.HOST).cached == 1
    assert mem.evict(Tier.GPU) == 3 and mem.evict(Tier.GPU) == 0
    assert (mem.cached_prefix(Tier.GPU, CHAIN), mem.cached_prefix(Tier.HOST, CHAIN)) == (0, 4)
    assert mem.evict(Tier.HOST) == 4 and mem.cached_prefix(Tier.HOST, CHAIN) == 0  # no disk: gone
    assert mem.cached_prefix(Tier.DISK, CHAIN) == 0
    mem.check_invariants()


def test_evict_leaves_held_blocks_and_a_missing_host_evicts_nothing() -> None:
    mem = memory(gpu=4, host=0)
    cache_chain(mem)
    pinned = mem.gpu.cache.match(CHAIN[:2])
    assert mem.evict(Tier.HOST) == 0
    assert mem.evict(Tier.GPU) == 2 and mem.cached_prefix(Tier.GPU, CHAIN) == 2
    mem.gpu.cache.release(pinned)
    mem.check_invariants()


def test_the_disk_is_flushed_and_counted_through_the_door(tmp_path: Path) -> None:
    assert memory(gpu=4, host=4).disk_stats() is None
    memory(gpu=4, host=4).flush_disk()  # nothing to wait for
    mem = memory(gpu=4, host=4, disk=DiskConfig(tmp_path, capacity_bytes=1 << 20, segment_bytes=64 << 10))
    cache_chain(mem)
    mem.evict(Tier.GPU)
    mem.evict(Tier.HOST)  # the host spills the chain to disk, written on the disk's own thread
    mem.flush_disk()
    stats = mem.disk_stats()
    assert stats is not None and (stats.disk_blocks, stats.disk_writes) == (4, 4)
    assert mem.cached_prefix(Tier.DISK, CHAIN) == 4 and mem.cached_prefix(Tier.HOST, CHAIN) == 0
    mem.close()
