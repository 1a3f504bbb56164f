"""The adaptive eviction order (S3-FIFO with an ARC-style probation target): its exact choices, how
ghost hits move the target, and the whole order against a plain-list oracle under random stores,
re-uses, pins, demotions and evictions."""

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixmesh.common.block_pool.adaptive import AdaptiveS3FIFO
from radixmesh.common.block_pool.block_pool import BlockPool
from radixmesh.common.block_pool.config import PoolConfig, PoolHooks
from radixmesh.common.prefix_cache.prefix_cache import PrefixCache
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.ids import BlockId
from tests.support.hashes import h


class Clock:
    """The pool's clock: each tick releases at a later time, so the test fixes every release time."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def cache_of(n: int, clock: Clock, hooks: PoolHooks | None = None) -> PrefixCache:
    return PrefixCache(BlockPool(n, config=PoolConfig(eviction="adaptive"), clock=clock, hooks=hooks))


def order_of(cache: PrefixCache) -> AdaptiveS3FIFO:
    order = cache.pool._order
    assert isinstance(order, AdaptiveS3FIFO)
    return order


def store(cache: PrefixCache, keys: list[int]) -> list[BlockId]:
    """Compute and cache one chain of blocks under h(key) for each key; returns their ids."""
    ids = cache.pool.allocate(len(keys))
    cache.insert([h(k) for k in keys], ids)
    cache.release(ids)
    return ids


@pytest.mark.parametrize(("eviction", "gone"), [
    # probation's 7 beyond a share of 3 (oldest first, a chain's tail first), then main's t=1
    # blocks before probation's t=4 ones
    ("adaptive", {10, 11, 20, 21, 35, 34, 33, 1, 0}),
    # S3-FIFO: probation down to a share of 1 before main loses any
    ("s3fifo", {10, 11, 20, 21, 35, 34, 33, 32, 31}),
])
def test_within_its_share_probation_is_evicted_by_age_with_main(eviction: str, gone: set[int]) -> None:
    clock = Clock()
    cache = PrefixCache(BlockPool(12, config=PoolConfig(eviction=eviction), clock=clock))
    store(cache, [0, 1])  # t=0
    clock.now = 1
    cache.release(cache.match([h(0), h(1)]))  # re-used at t=1: main
    clock.now = 2
    store(cache, [10, 11])
    clock.now = 3
    store(cache, [20, 21])
    clock.now = 4
    store(cache, [30, 31, 32, 33, 34, 35])  # the pool is full: probation holds 10 of 12
    assert cache.pool.evict(9) == 9
    assert {k for k in (0, 1, 10, 11, 20, 21, 30, 31, 32, 33, 34, 35) if h(k) not in cache} == gone
    cache.check_invariants()


def test_a_hash_back_from_probations_ghost_grows_the_target() -> None:
    clock = Clock()
    cache = cache_of(10, clock)
    order = order_of(cache)
    order.target = 0.0
    store(cache, [1, 2, 3])
    cache.pool.evict(3)  # probation over a share of 0: its three go to the ghost
    assert order.ghosted_main == 0 and len(order._ghost) == 3
    (b,) = store(cache, [2])
    # ARC's step: max(1, main's ghost / probation's ghost, this hash counted) = 1.
    assert order.target == 1.0 and order.main.is_stamped(b)
    order.check_invariants()


def test_a_hash_back_from_mains_ghost_shrinks_the_target_by_arcs_ratio() -> None:
    clock = Clock()
    cache = cache_of(10, clock)
    order = order_of(cache)
    order.target = 10.0  # the whole pool: one LRU of both queues
    store(cache, [1])
    cache.release(cache.match([h(1)]))  # main
    clock.now = 1
    store(cache, [2, 3, 4])  # probation, newer
    cache.pool.evict(4)  # all by age: h(1) from main, then h(4), h(3), h(2) from probation
    assert order.ghosted_main == 1 and len(order._ghost) == 4
    (b,) = store(cache, [1])
    # probation's ghost holds 3, main's 1 (this hash): the step is max(1, 3 / 1) = 3.
    assert order.target == 7.0 and order.main.is_stamped(b)
    order.check_invariants()


def test_the_target_stays_within_the_pool() -> None:
    clock = Clock()
    cache = cache_of(4, clock)
    order = order_of(cache)
    order.target = 3.5
    store(cache, [1, 2, 3, 4])
    order.target = 0.0
    cache.pool.evict(4)
    order.target = 3.5
    store(cache, [1, 2])  # two ghost hits of at least one block each, capped at 4
    assert order.target == 4.0
    order.check_invariants()


def test_a_hash_the_cluster_recalls_goes_to_main_and_moves_no_target() -> None:
    clock = Clock()
    cache = cache_of(4, clock, PoolHooks(recalled=lambda x: x == h(7)))
    order = order_of(cache)
    before = order.target
    a, b = store(cache, [7]), store(cache, [8])
    assert order.main.is_stamped(a[0]) and order.small.is_stamped(b[0]) and order.target == before


def test_blocks_removed_for_good_enter_the_ghost_by_queue() -> None:
    clock = Clock()
    cache = cache_of(6, clock)
    order = order_of(cache)
    (a,) = store(cache, [1])
    cache.release(cache.match([h(1)]))  # main
    (b,) = store(cache, [2])  # probation
    order.discard([a, b])
    assert order._ghost == {h(1): True, h(2): False} and order.ghosted_main == 1


def test_oldest_names_what_pop_oldest_takes_when_probation_is_pinned() -> None:
    # Probation is over a share of 0 by its one stamped block, but that block is pinned: both
    # look past it to main (regression: oldest once came back empty here).
    clock = Clock()
    cache = cache_of(4, clock)
    order = order_of(cache)
    order.target = 0.0
    (a,) = store(cache, [1])
    cache.release(cache.match([h(1)]))  # main
    store(cache, [2])
    held = cache.match([h(2)])
    assert order.oldest(1) == [a] == order.pop_oldest(1)
    cache.release(held)


class Oracle:
    """The adaptive order in plain lists: stamped blocks per queue in eviction order, each with its
    release time; the ghost as a list of (hash, from main); the target as ARC moves it."""

    def __init__(self, n: int, fraction: float) -> None:
        self.small: list[int] = []
        self.main: list[int] = []
        self.when: dict[int, float] = {}
        self.ghost: list[tuple[BlockHash, bool]] = []
        self.cap = n
        self.target = fraction * n

    def push(self, blocks: list[int], hashes: dict[int, BlockHash], now: float) -> None:
        to_small, to_main = [], []
        for b in blocks:
            ghosted = {g: m for g, m in self.ghost}
            if b in self.main or b in self.small:
                (self.main if b in self.main else self.small).remove(b)
                to_main.append(b)
            elif hashes[b] in ghosted:
                from_main = ghosted[hashes[b]]
                self.ghost.remove((hashes[b], from_main))
                mains = sum(m for _, m in self.ghost)
                smalls = len(self.ghost) - mains
                if from_main:
                    self.target = max(0.0, self.target - max(1.0, smalls / (mains + 1)))
                else:
                    self.target = min(self.cap, self.target + max(1.0, mains / (smalls + 1)))
                to_main.append(b)
            else:
                to_small.append(b)
        for b in to_small + to_main:
            self.when[b] = now
        self.small += to_small
        self.main += to_main

    def demote(self, blocks: Sequence[int]) -> None:
        for b in blocks:
            (self.main if b in self.main else self.small).remove(b)
            self.when[b] = float("-inf")
        self.small[:0] = list(blocks)

    def evict(self, k: int, ref: dict[int, int], hashes: dict[int, BlockHash]) -> list[int]:
        excess = len(self.small) - int(self.target)
        out = [b for b in self.small if not ref[b]][: min(k, max(0, excess))]
        for b in out:
            self._remove(b, hashes, False)
        while len(out) < k:
            s = next((b for b in self.small if not ref[b]), None)
            m = next((b for b in self.main if not ref[b]), None)
            if s is None and m is None:
                break
            take_small = m is None or (s is not None and self.when[s] <= self.when[m])
            victim = s if take_small else m
            assert victim is not None
            self._remove(victim, hashes, not take_small)
            out.append(victim)
        return out

    def _remove(self, b: int, hashes: dict[int, BlockHash], from_main: bool) -> None:
        (self.main if from_main else self.small).remove(b)
        self.ghost.append((hashes[b], from_main))
        del self.ghost[: max(0, len(self.ghost) - self.cap)]


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(st.integers(2, 12), st.sampled_from([0.1, 0.3, 0.9]), st.data())
def test_adaptive_against_an_oracle(n: int, fraction: float, data: st.DataObject) -> None:
    evicted: list[int] = []
    clock = Clock()
    pool = BlockPool(n, config=PoolConfig(eviction="adaptive"), clock=clock,
                     hooks=PoolHooks(on_evict=lambda pairs: evicted.extend(b for b, _ in pairs)))
    order = pool._order
    assert isinstance(order, AdaptiveS3FIFO)
    order.target = fraction * n
    oracle = Oracle(n, fraction)
    hashes: dict[int, BlockHash] = {}
    ref = dict.fromkeys(range(n), 0)
    pinned: list[BlockId] = []
    """Cached blocks held across operations (a running request's prefix): stamped, not members."""
    for _ in range(data.draw(st.integers(1, 30))):
        # Time stands still now and then, so releases tie across the queues.
        clock.now += data.draw(st.sampled_from([0.0, 1.0]))
        op = data.draw(st.sampled_from(["store", "reuse", "evict", "pin", "unpin", "demote"]))
        cached = [BlockId(b) for b in hashes if not ref[b]]
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
            oracle.push(list(reversed(ids)), hashes, clock.now)
        elif op == "reuse" and cached:
            ids = data.draw(st.lists(st.sampled_from(cached), min_size=1, unique=True))
            pool.incref(ids)
            pool.free(ids)
            oracle.push(list(reversed(ids)), hashes, clock.now)
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
            oracle.push(list(reversed(pinned)), hashes, clock.now)
            pinned = []
        elif op == "evict":
            k = data.draw(st.integers(0, n))
            ahead = order.oldest(k)
            want = oracle.evict(min(k, pool.num_cached), ref, hashes)
            evicted.clear()
            assert pool.evict(k) == len(want) and evicted == want == ahead
            for b in want:
                del hashes[b]
        pool.check_invariants()
        assert [b for b in oracle.small if not ref[b]] == order.small.members()
        assert [b for b in oracle.main if not ref[b]] == order.main.members()
        assert order.target == oracle.target
        assert list(order._ghost.items()) == oracle.ghost
