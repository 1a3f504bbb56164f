"""MemoryConfig: the sizes of a node's tiers and whether its prefixes are shared."""

from dataclasses import dataclass, field

from radixmesh.common.block_pool.config import PoolConfig
from radixmesh.node_agent.memory.disk.tier import DiskConfig
from radixmesh.node_agent.memory.zones.governor import ZoneSetup

STAGING_HOST_BLOCKS = 64
"""Host blocks of a disk tier configured without a host tier: disk reads reach the gpu through them in
runs of at most this many (the prefix match repeats until the run ends), and gpu evictions they
cannot take go straight to disk (memory.tiers.HostTier.demote). 128 MiB at Llama-3-8B's 2 MiB blocks."""


@dataclass(frozen=True, slots=True)
class MemoryConfig:
    """Sizes of the two tiers and whether prefixes are shared."""

    num_gpu_blocks: int = 512
    num_host_blocks: int = 0
    """0: no host tier (preemption always recomputes, no promotion)."""
    enable_prefix_caching: bool = True
    """False: nothing is matched or inserted (the "caching off" baseline)."""
    hash_key: bytes = b""
    """The cluster's block-hash key (block_hash.hash_blocks)."""
    demote_evicted: bool = True
    """Copy prefix blocks evicted from the gpu tier into the host tier (when there is one) instead
    of dropping them; the host tier's own LRU makes room."""
    pool: PoolConfig = field(default_factory=PoolConfig)
    zones: ZoneSetup = field(default_factory=ZoneSetup)
    """How the gpu pool is split between running KV and the prefix cache (memory/zones/governor.py)."""
    disk: DiskConfig | None = None
    """The disk tier under the host tier (memory.disk); without num_host_blocks it gets a host tier of
    STAGING_HOST_BLOCKS (`host_blocks`). None: none."""

    def __post_init__(self) -> None:
        if self.num_gpu_blocks < 1 or self.num_host_blocks < 0:
            raise ValueError(f"need num_gpu_blocks >= 1 and num_host_blocks >= 0, got "
                             f"{self.num_gpu_blocks}, {self.num_host_blocks}")

    @property
    def host_blocks(self) -> int:
        """The host tier's size: num_host_blocks, or STAGING_HOST_BLOCKS for a disk tier given none
        (disk reads land in the host tier; issue 40: users had to size one to get a disk tier)."""
        return self.num_host_blocks or (STAGING_HOST_BLOCKS if self.disk is not None else 0)
