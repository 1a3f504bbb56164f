"""One memory tier of a node (gpu or host): a block pool, its prefix cache, and the KV tensor the
pool's block ids index; and the one way blocks are copied between tiers."""

from collections.abc import Callable, Sequence

import torch

from radixmesh import kernels
from radixmesh.node_agent.memory.block_pool import BlockPool
from radixmesh.node_agent.memory.pool_config import PoolConfig
from radixmesh.node_agent.memory.prefix_cache import EvictionHook, PrefixCache
from radixmesh.proto.events import Tier
from radixmesh.proto.ids import BlockId
from radixmesh.proto.kv_layout import KVLayout


class TierMemory:
    """One tier: a pool, its prefix cache, and the cache tensor the pool's block ids index."""

    def __init__(self, layout: KVLayout, num_blocks: int, tier: Tier, device: str | torch.device,
                 config: PoolConfig, clock: Callable[[], float], on_evict: EvictionHook | None = None) -> None:
        self.kv = layout.new_cache(num_blocks, device)
        self.pool = BlockPool(num_blocks, tier=tier, block_bytes=layout.block_bytes, config=config, clock=clock)
        self.cache = PrefixCache(self.pool, on_evict=on_evict)


def copy_blocks(src: TierMemory, src_ids: Sequence[BlockId], dst: TierMemory, dst_ids: Sequence[BlockId]) -> None:
    """Copy whole blocks (every layer, K and V) between tiers: one gather, one scatter."""
    buffer = kernels.gather_blocks(src.kv, src_ids)
    kernels.scatter_blocks(buffer.to(dst.kv.device), dst.kv, dst_ids)
