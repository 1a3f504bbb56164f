"""What a node announces of its cache to the metadata service, read from its engine's memory on the
engine thread: its capacity (NodeInfo), every cached block (the snapshot after each registration)
and the changes since (events).

The snapshot is how a restarted node's disk blocks (re-indexed when the tier opened) reach the index
under its new epoch, so the cluster routes to them again; between snapshots the disk publishes its
own changes as events (DiskTier.take_events), while it holds at most ANNOUNCED_BLOCKS."""

from radixmesh.common.metadata.publisher import chains
from radixmesh.node_agent.engine.paged_memory import PagedMemory
from radixmesh.node_agent.memory.disk.tier import ANNOUNCED_BLOCKS
from radixmesh.proto.events import BlockStored, CacheEvent, Tier

MAX_ANNOUNCED_DISK_BLOCKS = ANNOUNCED_BLOCKS
"""Disk blocks a node announces at most, the newest: the metadata service refuses a snapshot past its
max_snapshot_blocks (1 << 20 by default) whole, and the gpu and host tiers need their share."""


def announced_capacity(memory: PagedMemory) -> int:
    """Every tier's blocks, the disk's up to what it announces: the index holds what any tier caches,
    and refuses a node holding more than it declared."""
    disk = memory.disk
    return (sum(t.pool.num_blocks for t in memory.tiers)
            + (min(disk.capacity_blocks, MAX_ANNOUNCED_DISK_BLOCKS) if disk is not None else 0))


def take_cache_events(memory: PagedMemory) -> list[CacheEvent]:
    """Every tier's events since the last call, gpu first, then what reached or left the disk."""
    events = [e for t in memory.tiers for e in t.cache.take_events()]
    if memory.disk is not None:
        events += memory.disk.take_events()
    return events


def cached_chains(memory: PagedMemory) -> tuple[BlockStored, ...]:
    """Every cached block of the gpu and host tiers as chains, and the disk tier's newest
    MAX_ANNOUNCED_DISK_BLOCKS; drain the events first, so that the snapshot covers what they said."""
    stored = [c for t in memory.tiers for c in chains(t.cache.snapshot(), t.cache.tier)]
    if memory.disk is not None:
        stored += chains(memory.disk.chains(MAX_ANNOUNCED_DISK_BLOCKS), Tier.DISK)
    return tuple(stored)
