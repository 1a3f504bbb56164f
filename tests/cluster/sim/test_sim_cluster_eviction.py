"""Cluster-aware eviction: the pool's choice among its oldest cached blocks (exact, and against an
oracle), the prefix cache's chain ends, holder counts from events, and the simulator running with it."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixmesh.cluster.sim.config import SimConfig
from radixmesh.cluster.sim.holders import HolderCount
from radixmesh.cluster.sim.simulator import Simulator, prepare
from radixmesh.cluster.sim.trace import TraceRequest
from radixmesh.common.block_pool.block_pool import BlockPool
from radixmesh.common.block_pool.config import PoolHooks
from radixmesh.common.block_pool.eviction import CopiesElsewhere
from radixmesh.common.prefix_cache.prefix_cache import PrefixCache
from radixmesh.proto.events import AllCleared, BlockRemoved, BlockStored, Tier
from tests.support.hashes import h


def cached(n: int, copies: CopiesElsewhere | None = None, window: int = 0) -> PrefixCache:
    """n blocks, each cached alone under h(id), released in id order (block 0 oldest), in a pool
    whose cluster-aware eviction (PoolHooks) is `copies` and `window`."""
    cache = PrefixCache(BlockPool(n, hooks=PoolHooks(copies_elsewhere=copies, eviction_window=window)))
    for b in cache.pool.allocate(n):
        cache.insert([h(b)], [b])
        cache.release([b])
    return cache


@pytest.mark.parametrize(("window", "victims"), [(0, [0, 1]), (1, [0, 1]), (2, [3, 0]), (4, [3, 4])])
def test_replicated_blocks_go_first_among_the_oldest(window: int, victims: list[int]) -> None:
    elsewhere = {h(3), h(4)}
    cache = cached(6, lambda x: int(x in elsewhere), window)
    assert sorted(cache.pool.allocate(2)) == sorted(victims)
    assert [h(v) in cache for v in victims] == [False, False]
    cache.check_invariants()


def test_without_copies_eviction_is_plain_lru() -> None:
    cache = cached(4, None, 100)
    assert cache.pool.allocate(2) == [0, 1]
    with pytest.raises(ValueError, match="window"):
        PoolHooks(eviction_window=-1)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 12), st.data())
def test_cluster_eviction_against_an_oracle(n: int, data: st.DataObject) -> None:
    """Oracle: the LRU order is release order; of its first k + window blocks, the replicated ones
    in that order, then the others in that order, the first k of them."""
    replicated = data.draw(st.sets(st.integers(0, n - 1)))
    window = data.draw(st.integers(0, n))
    k = data.draw(st.integers(1, n))
    cache = cached(n, lambda x: int(int.from_bytes(x, "little") in replicated), window)
    oldest = list(range(n))[: k + window]
    want = ([b for b in oldest if b in replicated] + [b for b in oldest if b not in replicated])[:k]
    assert cache.pool.allocate(k) == want
    cache.check_invariants()


def test_oldest_peeks_without_removing() -> None:
    cache = cached(5)
    lru = cache.pool._order
    assert lru.oldest(3) == [0, 1, 2] and lru.oldest(99) == [0, 1, 2, 3, 4]
    assert cache.pool.num_cached == 5


def test_chain_ends_are_leaves() -> None:
    cache = PrefixCache(BlockPool(4))
    ids = cache.pool.allocate(3)
    cache.insert([h(10), h(11), h(12)], ids)
    assert [cache.is_leaf(x) for x in (h(10), h(11), h(12))] == [False, False, True]
    cache.release(ids)
    cache.pool.allocate(3)  # the free block, then the chain's tail first: 12, then 11
    assert cache.is_leaf(h(10)) and h(11) not in cache
    cache.check_invariants()


def test_holder_count_follows_events() -> None:
    count = HolderCount()
    count.apply([BlockStored((h(1), h(2)), None, Tier.GPU)])
    count.apply([BlockStored((h(1),), None, Tier.GPU)])
    assert (count.holders(h(1)), count.holders(h(2)), count.others(h(1))) == (2, 1, 1)
    count.apply([BlockRemoved((h(1), h(2)), Tier.GPU)])
    assert (count.holders(h(1)), count.holders(h(2))) == (1, 0)
    with pytest.raises(TypeError, match="never clear"):
        count.apply([AllCleared()])


def test_simulator_runs_with_cluster_eviction_and_keeps_its_invariants() -> None:
    rows = [(i * 0.5, [i % 3, 10 + i % 5, 100 + i]) for i in range(40)]
    requests = prepare([TraceRequest(t, 512 * len(ids), 1, tuple(ids)) for t, ids in rows])
    reports = {}
    for eviction, cluster in (("lru", False), ("lru", True), ("s3fifo", False), ("s3fifo", True)):
        config = SimConfig(nodes=3, capacity_blocks=6, policy="cost", eviction=eviction, cluster_eviction=cluster,
                           cluster_recall=cluster, handoff=cluster, check_every=1)
        sim = Simulator(config)
        reports[eviction, cluster] = r = sim.run(requests)
        assert sum(r.hits_by_source.values()) == r.blocks
        for node in sim.nodes.values():
            for hash_, _ in node.cache.snapshot():
                assert sim.holders.holders(hash_) >= 1
    assert len({r.global_lru for r in reports.values()}) == 1
    assert reports["lru", False].global_same_eviction == reports["lru", False].global_lru
    assert reports["s3fifo", True].global_same_eviction == reports["s3fifo", False].global_same_eviction
    with pytest.raises(ValueError, match="eviction"):
        SimConfig(nodes=1, capacity_blocks=1, eviction="fifo")
