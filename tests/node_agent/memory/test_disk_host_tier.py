"""The disk tier under the host tier (memory.tiers): prefix blocks the host evicts go to disk, and a
prefix that misses the host is read back from disk through the host into the gpu, bit for bit, in
this process or in the next one (a reopened directory)."""

import random
from pathlib import Path

import torch

from radixmesh.common.block_pool.config import PoolConfig
from radixmesh.node_agent.engine.config import EngineConfig
from radixmesh.node_agent.engine.engine import Engine
from radixmesh.node_agent.engine.metrics import EngineCounters
from radixmesh.node_agent.engine.preemption import FixedPreemption
from radixmesh.node_agent.engine.request import Request, RequestId
from radixmesh.node_agent.memory.config import MemoryConfig
from radixmesh.node_agent.memory.disk.record import HEADER_BYTES, DiskIdentity
from radixmesh.node_agent.memory.disk.tier import DiskConfig, DiskTier
from radixmesh.node_agent.memory.sequence import PreemptMode
from radixmesh.node_agent.memory.tiers import HostTier, TierMemory
from radixmesh.proto.block_hash import hash_blocks
from radixmesh.proto.events import Tier
from radixmesh.proto.kv_layout import KVLayout
from radixmesh.proto.serve.sampling import SamplingParams
from tests.support.tiny_model import tiny_model

BS = 4
LAYOUT = KVLayout(model_id="t", num_layers=2, num_kv_heads=1, head_dim=4, dtype="bfloat16", block_size=BS)
CHAIN = hash_blocks(list(range(3 * BS)), BS)
OTHER = hash_blocks(list(range(100, 100 + 3 * BS)), BS)


def tiers(path: Path, host_blocks: int = 3) -> tuple[TierMemory, HostTier, DiskTier]:
    disk = DiskTier(DiskConfig(path, capacity_bytes=1 << 20, segment_bytes=64 << 10), DiskIdentity.of(LAYOUT, b"k"))
    gpu = TierMemory(LAYOUT, 4, Tier.GPU, "cpu", PoolConfig(), clock=lambda: 0.0)
    host = HostTier(LAYOUT, host_blocks, PoolConfig(), EngineCounters(), FixedPreemption(PreemptMode.SWAP),
                    clock=lambda: 0.0, disk=disk)
    return gpu, host, disk


def cache_on_host(host: HostTier, hashes: list, first_value: float) -> torch.Tensor:
    """`hashes` as one chain of released host blocks holding first_value, first_value + 1, ...;
    returns their KV."""
    blocks = host.pool.allocate(len(hashes))
    for i, b in enumerate(blocks):
        host.kv[b] = first_value + i + torch.arange(host.kv[b].numel()).view(host.kv[b].shape) / 64
    host.cache.insert(hashes, blocks)
    host.cache.release(blocks)
    return host.kv[blocks].clone()


def test_host_evictions_go_to_disk_and_come_back_through_the_host(tmp_path: Path) -> None:
    gpu, host, disk = tiers(tmp_path)
    want = cache_on_host(host, CHAIN, 1.0)
    cache_on_host(host, OTHER, 10.0)  # evicts CHAIN from the host, tail first
    disk.flush()
    assert host.cache.longest_prefix(CHAIN) == 0 and all(h in disk for h in CHAIN)
    got, from_disk = host.promote(gpu, CHAIN, 0)
    assert len(got) == 3 and from_disk == 3 and torch.equal(gpu.kv[got], want)
    assert gpu.cache.longest_prefix(CHAIN) == 3 and host.cache.longest_prefix(CHAIN) == 3
    assert disk.stats().disk_reads == 3
    gpu.cache.release(got)
    again, from_disk = host.promote(gpu, CHAIN, 0)  # now a host hit: nothing read from disk
    assert len(again) == 3 and from_disk == 0 and disk.stats().disk_reads == 3
    gpu.cache.release(again)
    host.cache.check_invariants()
    gpu.cache.check_invariants()
    disk.close()


def test_the_host_reads_only_what_it_has_room_for(tmp_path: Path) -> None:
    gpu, host, disk = tiers(tmp_path)
    cache_on_host(host, CHAIN, 1.0)
    cache_on_host(host, OTHER, 10.0)
    disk.flush()
    pinned = host.cache.match(OTHER[:2])  # 1 host block left that the disk run may use
    got, from_disk = host.promote(gpu, CHAIN, 0)
    assert len(got) == 1 and from_disk == 1 and disk.stats().disk_reads == 1
    gpu.cache.release(got)
    host.cache.release(pinned)
    disk.close()


def test_a_record_that_fails_on_disk_ends_the_read_and_its_host_blocks_go_back_free(tmp_path: Path) -> None:
    """The disk reads straight into host blocks: a corrupt record in the middle of the run leaves the
    blocks before it cached and served, and the blocks allocated for it and after it free."""
    gpu, host, disk = tiers(tmp_path)
    want = cache_on_host(host, CHAIN, 1.0)
    cache_on_host(host, OTHER, 10.0)
    disk.flush()
    [segment] = tmp_path.glob("*.seg")
    position = disk.store.hashes().index(CHAIN[1])
    data = bytearray(segment.read_bytes())
    data[position * disk.store.identity.record_bytes + HEADER_BYTES + 3] ^= 0x40  # CHAIN[1]'s KV
    segment.write_bytes(bytes(data))
    got, from_disk = host.promote(gpu, CHAIN, 0)
    assert len(got) == 1 and from_disk == 1 and torch.equal(gpu.kv[got], want[:1])
    stats = disk.stats()
    assert stats.disk_reads == 1 and stats.disk_dropped_blocks["corrupt"] == 1 and CHAIN[1] not in disk
    assert host.cache.longest_prefix(CHAIN) == 1 and host.pool.num_free == 2
    gpu.cache.release(got)
    host.cache.check_invariants()
    disk.close()


def test_a_restarted_node_finds_its_blocks_on_disk(tmp_path: Path) -> None:
    _, host, disk = tiers(tmp_path)
    want = cache_on_host(host, CHAIN, 1.0)
    cache_on_host(host, OTHER, 10.0)
    disk.close()  # writes what is queued
    gpu, host, disk = tiers(tmp_path)  # a new process's tiers over the same directory
    assert host.cache.longest_prefix(CHAIN) == 0
    got, _ = host.promote(gpu, CHAIN, 0)
    assert torch.equal(gpu.kv[got], want)
    gpu.cache.release(got)
    disk.close()


def test_an_engine_serves_a_prefix_its_host_evicted_from_disk_with_the_same_tokens(tmp_path: Path) -> None:
    """MemoryConfig.disk end to end: a prefix pushed out of gpu and host by other prompts comes back
    from the disk tier, and the greedy tokens equal a cache-less engine's; the disk families are on
    the engine's metrics."""
    model = tiny_model(seed=0)
    bs = 8
    rng = random.Random(3)
    prompts = [tuple(rng.randrange(256) for _ in range(6 * bs)) for _ in range(5)]
    requests = [Request(RequestId(f"r{i}"), p, SamplingParams(max_tokens=4, ignore_eos=True))
                for i, p in enumerate([*prompts, prompts[0]])]

    def make(memory: MemoryConfig) -> Engine:
        return Engine(model, EngineConfig(block_size=bs, memory=memory))

    want = [make(MemoryConfig(num_gpu_blocks=64, enable_prefix_caching=False)).generate([r])[0] for r in requests]
    disk = DiskConfig(tmp_path, capacity_bytes=1 << 22, segment_bytes=64 << 10)
    eng = make(MemoryConfig(num_gpu_blocks=8, num_host_blocks=8, disk=disk))
    got = []
    for r in requests:
        got += eng.generate([r])
        eng.memory.flush_disk()  # the writer thread has written what the host evicted so far
    assert [g.output_token_ids for g in got] == [w.output_token_ids for w in want]
    sources = got[-1].stats.sources
    # The first prompt's blocks were pushed out of gpu and host: they came back from disk.
    assert sources is not None and sources.local_disk > 0 and sources.local_host == 0
    disk = eng.memory.disk_stats()
    assert disk is not None and sources.local_disk == disk.disk_reads * bs
    assert eng.stats().engine_cached_tokens["local_disk"] == sum(g.stats.sources.local_disk for g in got
                                                                 if g.stats.sources is not None)
    assert disk.disk_reads > 0
    assert "radixmesh_disk_reads_total" in eng.prometheus_text()
    eng.memory.close()
