"""Reference hit rates a routing result is judged against (block-weighted, trace blocks).

- infinite bound: a block is a hit if any earlier request had it (no capacity limit, perfect routing
  and pulling): no policy can beat it.
- global cache (global LRU with ``lru``): one PrefixCache over one BlockPool of the cluster's total
  capacity and a given eviction order, requests applied in arrival order with no time model: what
  the same memory achieves as one pooled cache.
"""

from collections.abc import Callable, Sequence

from radixmesh.common.block_pool.block_pool import BlockPool
from radixmesh.common.block_pool.config import PoolConfig
from radixmesh.common.prefix_cache.prefix_cache import EvictedBlock, PrefixCache
from radixmesh.proto.block_hash import BlockHash


def infinite_bound(prompts: Sequence[Sequence[BlockHash]]) -> float:
    """Fraction of blocks seen in an earlier prompt; 0.0 for no blocks."""
    seen: set[BlockHash] = set()
    hits = total = 0
    for hashes in prompts:
        hits += sum(1 for h in hashes if h in seen)
        total += len(hashes)
        seen.update(hashes)
    return hits / total if total else 0.0


def global_cache(
    prompts: Sequence[Sequence[BlockHash]],
    capacity_blocks: int,
    eviction: str = "lru",
    on_evict: Callable[[int, list[BlockHash]], None] | None = None,
) -> float:
    """Hit rate of one prefix cache of `capacity_blocks`, evicting in the order named `eviction`
    (`PoolConfig.eviction`), over the prompts in order. `on_evict(i, hashes)` hears of every
    eviction, made while admitting prompt i."""
    admitting = 0

    def heard(evicted: Sequence[EvictedBlock]) -> None:
        assert on_evict is not None
        on_evict(admitting, [e.hash for e in evicted])

    cache = PrefixCache(BlockPool(capacity_blocks, config=PoolConfig(eviction=eviction)),
                        on_evict=None if on_evict is None else heard)
    hits = total = 0
    for admitting, hashes in enumerate(prompts):
        local = cache.match(hashes)
        n_new = min(len(hashes) - len(local), cache.pool.num_free + cache.pool.num_cached)
        new = cache.pool.allocate(n_new)
        if new:
            lo = len(local)
            cache.insert(hashes[lo : lo + n_new], new, hashes[lo - 1] if lo else None)
        cache.release(local + new)
        cache.take_events()
        hits += len(local)
        total += len(hashes)
    return hits / total if total else 0.0
