"""Warm restarts at any pool size (issue 40): what reaches the disk tier, and what it evicts, become
index events as they happen; a clean stop writes what the gpu and host tiers cache (waiting for the
writer, never dropping), hottest last, within the disk's capacity and its time budget."""

from pathlib import Path

import torch

from radixmesh.common.block_pool.config import PoolConfig
from radixmesh.node_agent.engine.metrics import EngineCounters
from radixmesh.node_agent.engine.preemption import FixedPreemption
from radixmesh.node_agent.memory.disk.record import DiskIdentity
from radixmesh.node_agent.memory.disk.segments import SegmentStore
from radixmesh.node_agent.memory.disk.tier import DiskConfig, DiskTier, head_to_tail
from radixmesh.node_agent.memory.sequence import PreemptMode
from radixmesh.node_agent.memory.tiers import HostTier, TierMemory, persist_resident
from radixmesh.proto.block_hash import BlockHash, hash_blocks
from radixmesh.proto.events import BlockRemoved, BlockStored, Tier, chains
from radixmesh.proto.kv_layout import KVLayout

BS = 4
LAYOUT = KVLayout(model_id="t", num_layers=2, num_kv_heads=1, head_dim=4, dtype="bfloat16", block_size=BS)
IDENTITY = DiskIdentity.of(LAYOUT, b"k")
RECORD = IDENTITY.record_bytes
CHAIN = hash_blocks(list(range(3 * BS)), BS)
OTHER = hash_blocks(list(range(100, 100 + 2 * BS)), BS)


def disk_tier(path: Path, segments: int = 8, per_segment: int = 2, **kw: float) -> DiskTier:
    return DiskTier(DiskConfig(path, capacity_bytes=segments * per_segment * RECORD, segment_bytes=per_segment * RECORD,
                               **kw), IDENTITY)  # type: ignore[arg-type]


def cache(tier: TierMemory, hashes: list[BlockHash], value: float) -> torch.Tensor:
    """`hashes` as one cached chain in `tier` holding value, value + 1, ...; returns their KV."""
    blocks = tier.pool.allocate(len(hashes))
    for i, b in enumerate(blocks):
        tier.kv[b] = value + i
    tier.cache.insert(hashes, blocks)
    tier.cache.release(blocks)
    return tier.kv[blocks].clone()


def test_a_batch_written_tail_first_is_announced_head_to_tail() -> None:
    pairs = [(CHAIN[i], CHAIN[i - 1] if i else None) for i in reversed(range(3))]  # as the host demotes
    assert chains(head_to_tail(pairs), Tier.DISK) == [BlockStored(tuple(CHAIN), None, Tier.DISK)]
    assert chains(head_to_tail(pairs[:2]), Tier.DISK) == [BlockStored((CHAIN[1], CHAIN[2]), CHAIN[0], Tier.DISK)]


def test_blocks_written_become_stored_events_with_their_parents(tmp_path: Path) -> None:
    disk = disk_tier(tmp_path)
    for i in reversed(range(3)):
        disk.offer(CHAIN[i], bytes(LAYOUT.block_bytes), parent=CHAIN[i - 1] if i else None)
    disk.flush()
    links: dict[BlockHash, BlockHash | None] = {}
    for e in disk.take_events():  # one event per batch the writer took: how many races the offers
        assert isinstance(e, BlockStored) and e.tier == Tier.DISK
        links.update(zip(e.hashes, (e.parent, *e.hashes[:-1]), strict=True))
    assert links == {CHAIN[0]: None, CHAIN[1]: CHAIN[0], CHAIN[2]: CHAIN[1]}
    assert disk.take_events() == []
    disk.close()


def test_blocks_the_disk_evicts_become_removed_events(tmp_path: Path) -> None:
    disk = disk_tier(tmp_path, segments=2, per_segment=2)
    for h in [*CHAIN, *OTHER]:  # five blocks, room for four: the first segment (CHAIN[0:2]) goes
        disk.offer(h, bytes(LAYOUT.block_bytes), parent=None)
        disk.flush()
    events = disk.take_events()
    assert BlockRemoved((CHAIN[0], CHAIN[1]), Tier.DISK) in events
    assert [h for e in events if isinstance(e, BlockStored) for h in e.hashes] == [*CHAIN, *OTHER]
    disk.close()


def test_write_waits_for_room_where_offer_drops(tmp_path: Path) -> None:
    disk = disk_tier(tmp_path, queue_bytes=1)  # one block queued at a time
    for h in [*CHAIN, *OTHER]:
        disk.write(h, bytes(LAYOUT.block_bytes), parent=None)
    disk.flush()
    assert disk.offers_dropped == 0 and len(disk.store) == 5
    disk.close()


def test_a_clean_stop_writes_host_then_gpu_blocks_the_disk_lacks(tmp_path: Path) -> None:
    disk = disk_tier(tmp_path)
    gpu = TierMemory(LAYOUT, 4, Tier.GPU, "cpu", PoolConfig(), clock=lambda: 0.0)
    host = HostTier(LAYOUT, 4, PoolConfig(), EngineCounters(), FixedPreemption(PreemptMode.SWAP), clock=lambda: 0.0,
                    disk=disk)
    want_gpu = cache(gpu, CHAIN, 1.0)
    cache(host, CHAIN[:1], 7.0)  # also on the gpu: written once, from the host (colder first)
    want_host = cache(host, OTHER, 10.0)
    assert persist_resident((gpu, host), disk) == 2 + 3
    disk.close()
    store = SegmentStore(tmp_path, IDENTITY, 8 * 2 * RECORD, 2 * RECORD)
    assert store.hashes() == [CHAIN[0], *OTHER, *CHAIN[1:]]  # the hottest are the newest
    raw = [torch.frombuffer(bytearray(store.get(h) or b""), dtype=torch.bfloat16) for h in [*OTHER, *CHAIN[1:]]]
    assert torch.equal(torch.stack(raw), torch.cat([want_host, want_gpu[1:]]).view(len(raw), -1))
    store.close()


def test_a_clean_stop_writes_at_most_the_disks_capacity_within_its_time(tmp_path: Path) -> None:
    disk = disk_tier(tmp_path, segments=2, per_segment=1)  # room for 2 blocks
    gpu = TierMemory(LAYOUT, 4, Tier.GPU, "cpu", PoolConfig(), clock=lambda: 0.0)
    cache(gpu, CHAIN, 1.0)
    assert persist_resident((gpu,), disk) == 2
    disk.flush()
    assert disk.store.hashes() == CHAIN[1:]  # the newest two: nothing written only to be evicted
    disk.close()

    late = disk_tier(tmp_path / "late", persist_s=5.0)
    times = iter([0.0, 5.0])  # the deadline has passed before the first batch
    assert persist_resident((gpu,), late, clock=lambda: next(times)) == 0
    none = disk_tier(tmp_path / "none", persist_s=0.0)
    assert persist_resident((gpu,), none) == 0
    late.close()
    none.close()


def test_gpu_evictions_the_host_has_no_room_for_go_straight_to_disk(tmp_path: Path) -> None:
    """A disk tier's staging host is small: the tails of an eviction it cannot take were lost."""
    disk = disk_tier(tmp_path)
    host = HostTier(LAYOUT, 1, PoolConfig(), EngineCounters(), FixedPreemption(PreemptMode.SWAP), clock=lambda: 0.0,
                    disk=disk)
    gpu = TierMemory(LAYOUT, 4, Tier.GPU, "cpu", PoolConfig(), clock=lambda: 0.0,
                     on_evict=lambda evicted: host.demote(gpu, evicted))
    want = cache(gpu, CHAIN, 1.0)
    gpu.pool.allocate(4)  # evicts the chain, tail first
    disk.flush()
    assert host.cache.longest_prefix(CHAIN) == 1  # the head
    assert [h in disk for h in CHAIN] == [False, True, True]
    got = disk.get_run(CHAIN[1:])
    assert torch.equal(torch.stack([torch.frombuffer(bytearray(g), dtype=torch.bfloat16) for g in got]),
                       want[1:].reshape(2, -1))
    disk.close()
