"""NodeMemory's demotion: gpu prefix blocks evicted by an allocation are copied to the host tier,
bit for bit, within the host's room, and never at the cost of the gpu allocation."""

import torch

from radixmesh.node_agent.engine.metrics import EngineCounters
from radixmesh.node_agent.engine.preemption import FixedPreemption
from radixmesh.node_agent.memory.config import MemoryConfig
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


def memory(gpu: int, host: int) -> NodeMemory:
    return NodeMemory(LAYOUT, MemoryConfig(num_gpu_blocks=gpu, num_host_blocks=host), EngineCounters(),
                       FixedPreemption(PreemptMode.SWAP))


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
