"""Eviction orders of the block pool: the registry, S3-FIFO's exact choices, and S3-FIFO against a
plain-list oracle under random stores, re-uses and evictions."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixmesh.cluster.metadata.index import GlobalIndex
from radixmesh.common.block_pool.block_pool import BlockPool
from radixmesh.common.block_pool.config import PoolConfig, PoolHooks
from radixmesh.common.block_pool.eviction import make_eviction_order
from radixmesh.common.prefix_cache.prefix_cache import PrefixCache
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.events import BlockRemoved, BlockStored, Tier
from radixmesh.proto.ids import BlockId, NodeId
from tests.support.hashes import h


def s3_cache(n: int, hooks: PoolHooks | None = None) -> PrefixCache:
    return PrefixCache(BlockPool(n, config=PoolConfig(eviction="s3fifo"), hooks=hooks))


def store(cache: PrefixCache, keys: list[int]) -> list[int]:
    """Compute and cache one chain of blocks under h(key) for each key; returns their ids."""
    ids = cache.pool.allocate(len(keys))
    cache.insert([h(k) for k in keys], ids)
    cache.release(ids)
    return ids


def test_unknown_order_is_refused_with_the_valid_names() -> None:
    with pytest.raises(ValueError, match=r"'adaptive', 'lru', 's3fifo'"):
        PoolConfig(eviction="arc")
    with pytest.raises(ValueError, match="unknown eviction order 'arc'"):
        make_eviction_order("arc", [0], [None])


def test_a_reused_prefix_outlives_newer_one_hit_suffixes() -> None:
    # 10 blocks: probation may hold 1 (10%). Prefix [0, 1] is re-used once, then 8 suffix blocks
    # arrive; LRU would evict the prefix first (released before them), S3-FIFO the suffixes.
    cache = s3_cache(10)
    store(cache, [0, 1])
    cache.release(cache.match([h(0), h(1)]))
    store(cache, list(range(100, 108)))
    cache.pool.allocate(3)
    assert h(0) in cache and h(1) in cache
    gone = [k for k in range(100, 108) if h(k) not in cache]
    assert gone == [105, 106, 107]  # probation's oldest: the suffix chain's tail went in first
    cache.check_invariants()


def test_lru_evicts_the_reused_prefix_first() -> None:
    cache = PrefixCache(BlockPool(10, config=PoolConfig(eviction="lru")))
    store(cache, [0, 1])
    cache.release(cache.match([h(0), h(1)]))
    store(cache, list(range(100, 108)))
    cache.pool.allocate(2)
    assert h(0) not in cache and h(1) not in cache


def test_a_ghosted_hash_comes_back_to_main() -> None:
    cache = s3_cache(4)
    store(cache, [1, 2, 3, 4])
    cache.pool.allocate(1)  # evicts from probation: h(4), the chain's tail, goes to the ghost
    assert h(4) not in cache
    (b,) = store(cache, [4])  # evicts h(3); h(4) is back, and kept as re-used
    order = cache.pool._order
    assert order.main.is_stamped(b) and h(3) not in cache  # type: ignore[attr-defined]


def test_cluster_recall_sends_a_block_the_cluster_lost_to_main() -> None:
    cache = s3_cache(4, hooks=PoolHooks(recalled=lambda x: x == h(7)))
    a, b = store(cache, [7]), store(cache, [8])
    order = cache.pool._order
    assert order.main.is_stamped(a[0]) and order.small.is_stamped(b[0])  # type: ignore[attr-defined]


def test_index_remembers_last_copies_evicted() -> None:
    index = GlobalIndex(recall_blocks=2)
    a, b = NodeId("a"), NodeId("b")
    for n in (a, b):
        index.add_node(n, "L")
    index.apply(a, [BlockStored((h(1), h(2), h(3)), None, Tier.GPU)])
    index.apply(b, [BlockStored((h(1),), None, Tier.GPU)])
    index.apply(a, [BlockRemoved((h(1), h(2), h(3)), Tier.GPU)])
    # h(1) has a copy left on b; h(2) and h(3) lost their last one
    assert [index.recalled("L", h(i)) for i in (1, 2, 3)] == [False, True, True]
    index.apply(a, [BlockStored((h(4),), None, Tier.GPU), BlockRemoved((h(4),), Tier.GPU)])
    assert [index.recalled("L", h(i)) for i in (2, 3, 4)] == [False, True, True]  # capacity 2
    assert index.lost_since("L", 0, 10) == ([h(3), h(4)], 3) and index.lost_since("L", 2, 10) == ([h(4)], 3)
    index.apply(b, [BlockStored((h(3),), None, Tier.GPU)])
    assert not index.recalled("L", h(3))  # held again
    assert index.lost_since("L", 0, 10) == ([h(4)], 3) and not index.recalled("other layout", h(4))
    # a held block still counts among the last `recall_blocks` losses (as the simulator measured it)
    index.apply(a, [BlockStored((h(5),), None, Tier.GPU), BlockRemoved((h(5),), Tier.GPU)])
    index.apply(b, [BlockRemoved((h(3),), Tier.GPU)])  # lost again: the newest loss
    assert [index.recalled("L", h(i)) for i in (3, 4, 5)] == [True, False, True]
    assert index.lost_since("L", 3, 10) == ([h(5), h(3)], 5)
    index.check_invariants()


@pytest.mark.parametrize("eviction", ["lru", "s3fifo"])
def test_demoted_blocks_go_first_and_pinned_ones_stay(eviction: str) -> None:
    cache = PrefixCache(BlockPool(6, config=PoolConfig(eviction=eviction)))
    ids = [store(cache, [k])[0] for k in range(6)]
    cache.release(cache.match([h(5)]))  # re-used: under s3fifo it is in main
    held = cache.match([h(4)])
    assert cache.pool.demote([ids[5], ids[4], ids[5]]) == 1  # h(4) is pinned: left alone
    assert cache.pool.allocate(2) == [ids[5], ids[0]]
    cache.release(held)
    cache.check_invariants()
    with pytest.raises(ValueError, match="block ids"):
        cache.pool.demote([BlockId(6)])


def test_a_demoted_block_leaves_main_for_probations_head() -> None:
    cache = s3_cache(4)
    a, b = store(cache, [1])[0], store(cache, [2])[0]
    cache.release(cache.match([h(2)]))
    order = cache.pool._order
    assert order.main.is_stamped(b)  # type: ignore[attr-defined]
    cache.pool.demote([b])
    assert order.small.members() == [b, a] and not order.main.is_stamped(b)  # type: ignore[attr-defined]


class Oracle:
    """S3-FIFO in plain lists: stamped blocks per queue in eviction order, the ghost as a list, and the
    demoted blocks (at probation's head until released again or evicted), which go before every other
    member whatever probation's share (EvictionOrder.demote)."""

    def __init__(self, n: int, fraction: float = 0.1) -> None:
        self.small: list[int] = []
        self.main: list[int] = []
        self.ghost: list[BlockHash] = []
        self.demoted: set[int] = set()
        self.cap, self.fraction = n, fraction

    def push(self, blocks: list[int], hashes: dict[int, BlockHash]) -> None:
        to_small, to_main = [], []
        for b in blocks:
            self.demoted.discard(b)
            if b in self.main or b in self.small:
                (self.main if b in self.main else self.small).remove(b)
                to_main.append(b)
            elif hashes[b] in self.ghost:
                self.ghost.remove(hashes[b])
                to_main.append(b)
            else:
                to_small.append(b)
        self.small += to_small
        self.main += to_main

    def demote(self, blocks: list[int]) -> None:
        for b in blocks:
            (self.main if b in self.main else self.small).remove(b)
        self.small[:0] = blocks
        self.demoted.update(blocks)

    def evict(self, k: int, ref: dict[int, int], hashes: dict[int, BlockHash]) -> list[int]:
        excess = len(self.small) - int(self.fraction * (len(self.small) + len(self.main)))
        out = self._take(self.small, min(k, max(0, excess)), ref, hashes)
        out += self._take(self.small, k - len(out), ref, hashes, only=self.demoted)
        out += self._take(self.main, k - len(out), ref, None)
        out += self._take(self.small, k - len(out), ref, hashes)
        return out

    def _take(self, queue: list[int], k: int, ref: dict[int, int], ghost_of: dict[int, BlockHash] | None,
              only: set[int] | None = None) -> list[int]:
        """The first k unpinned blocks of `queue` (of those in `only`, when given), removed; their
        hashes to the ghost when given."""
        out = [b for b in queue if not ref[b] and (only is None or b in only)][:k]
        for b in out:
            queue.remove(b)
            self.demoted.discard(b)
            if ghost_of is not None:
                self.ghost.append(ghost_of[b])
        del self.ghost[: max(0, len(self.ghost) - self.cap)]
        return out


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(st.integers(2, 12), st.data())
def test_s3fifo_against_an_oracle(n: int, data: st.DataObject) -> None:
    evicted: list[int] = []
    pool = BlockPool(n, config=PoolConfig(eviction="s3fifo"),
                     hooks=PoolHooks(on_evict=lambda pairs: evicted.extend(b for b, _ in pairs)))
    oracle = Oracle(n)
    hashes: dict[int, BlockHash] = {}
    ref = dict.fromkeys(range(n), 0)
    pinned: list[int] = []
    """Cached blocks held across operations (a running request's prefix): stamped, not members."""
    for _ in range(data.draw(st.integers(1, 25))):
        op = data.draw(st.sampled_from(["store", "reuse", "evict", "pin", "unpin", "demote"]))
        cached = [b for b in hashes if not ref[b]]
        if op == "store":
            k = data.draw(st.integers(1, n))
            if k > pool.num_free + pool.num_cached:
                continue
            shortfall = max(0, k - pool.num_free)
            want = oracle.evict(shortfall, ref, hashes)
            evicted.clear()
            ids = pool.allocate(k)
            assert evicted == want
            for b in want:
                del hashes[b]
            # hashes from a small universe, so some come back after their eviction (the ghost)
            free_keys = [x for x in range(3 * n) if h(x) not in hashes.values()]
            keys = data.draw(st.lists(st.sampled_from(free_keys), min_size=k, max_size=k, unique=True))
            for b, key in zip(ids, keys, strict=True):
                pool.set_hash(b, h(key))
                hashes[b] = h(key)
            pool.free(ids)
            oracle.push(list(reversed(ids)), hashes)
        elif op == "reuse" and cached:
            ids = data.draw(st.lists(st.sampled_from(cached), min_size=1, unique=True))
            pool.incref(ids)
            for b in ids:
                ref[b] += 1
            pool.free(ids)
            for b in ids:
                ref[b] -= 1
            oracle.push(list(reversed(ids)), hashes)
        elif op == "demote" and cached:
            ids = data.draw(st.lists(st.sampled_from(cached), min_size=1, unique=True))
            assert pool.demote(ids) == len(ids)
            oracle.demote(ids)
        elif op == "pin" and cached:
            more = data.draw(st.lists(st.sampled_from(cached), min_size=1, unique=True))
            pool.incref(more)
            for b in more:
                ref[b] += 1
            pinned += more
        elif op == "unpin" and pinned:
            pool.free(pinned)
            for b in pinned:
                ref[b] -= 1
            oracle.push(list(reversed(pinned)), hashes)
            pinned = []
        elif op == "evict":
            k = data.draw(st.integers(0, n))
            want = oracle.evict(min(k, pool.num_cached), ref, hashes)
            evicted.clear()
            assert pool.evict(k) == len(want) and evicted == want
            for b in want:
                del hashes[b]
        pool.check_invariants()
        order = pool._order
        assert [b for b in oracle.small if not ref[b]] == order.small.members()  # type: ignore[attr-defined]
        assert [b for b in oracle.main if not ref[b]] == order.main.members()  # type: ignore[attr-defined]
