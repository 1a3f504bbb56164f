"""BlockPool: exact state after allocation, free-run best fit, LRU eviction, OOM reasons, two-phase GC."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixmesh.common.block_pool.block_pool import BlockPool, OutOfBlocks
from radixmesh.common.block_pool.config import PoolConfig, PoolHooks
from radixmesh.common.block_pool.free_runs import FreeRuns
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.events import Tier
from radixmesh.proto.ids import BlockId
from tests.support.hashes import h


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def ids(*xs: int) -> list[BlockId]:
    return [BlockId(x) for x in xs]


def cache_blocks(pool: BlockPool, blocks: list[BlockId], base: int = 0) -> None:
    """Hash blocks the caller holds and release them: they become cached (ref 0, evictable)."""
    for i, b in enumerate(blocks):
        pool.set_hash(b, h(base + i))
    pool.free(blocks)


def test_fresh_pool_allocates_the_head_of_its_single_run() -> None:
    pool = BlockPool(8)
    assert pool.allocate(3) == [0, 1, 2]
    assert [pool.ref_count(BlockId(b)) for b in range(4)] == [1, 1, 1, 0]
    assert (pool.num_free, pool.num_in_use, pool.num_cached) == (5, 3, 0)
    assert pool.free_run_sizes() == [5]
    pool.check_invariants()


def test_best_fit_takes_the_shortest_run_that_fits() -> None:
    pool = BlockPool(12)
    pool.allocate(12)
    # free runs: [0,1] (2), [3..7] (5), [9..11] (3)
    pool.free(ids(0, 1, 3, 4, 5, 6, 7, 9, 10, 11))
    assert pool.free_run_sizes() == [2, 3, 5]
    assert pool.allocate(3) == [9, 10, 11]
    assert pool.allocate(2) == [0, 1]
    assert pool.allocate(4) == [3, 4, 5, 6]
    assert pool.free_run_sizes() == [1]
    pool.check_invariants()


def test_free_coalesces_adjacent_runs() -> None:
    pool = BlockPool(6)
    pool.allocate(6)
    pool.free(ids(1))
    pool.free(ids(3))
    assert pool.free_run_sizes() == [1, 1]
    pool.free(ids(2))
    assert pool.free_run_sizes() == [3]
    pool.free(ids(5, 4, 0))
    assert pool.free_run_sizes() == [6] and pool.largest_free_run() == 6
    pool.check_invariants()


def test_without_a_fitting_run_the_longest_runs_go_first() -> None:
    pool = BlockPool(10)
    pool.allocate(10)
    pool.free(ids(0, 2, 3, 5, 6, 7))  # runs [0], [2,3], [5,6,7]
    assert pool.allocate(5) == [5, 6, 7, 2, 3]
    assert pool.free_run_sizes() == [1]
    pool.check_invariants()


def test_scattered_allocation_takes_only_the_head_it_needs_of_the_last_run() -> None:
    # regression: the longest-first fill once took the last run whole (11 blocks for 7)
    pool = BlockPool(12)
    first = pool.allocate(5)
    pool.allocate(1)  # block 5 separates runs [0..4] and [6..11]
    pool.free(first)
    assert pool.allocate(7) == [6, 7, 8, 9, 10, 11, 0]
    assert pool.free_run_sizes() == [4] and pool.num_free == 4
    pool.check_invariants()


def test_free_runs_take_range_splits_a_run() -> None:
    runs = FreeRuns(10)
    assert runs.take_range(3, 4) == [3, 4, 5, 6]
    assert runs.runs() == [(0, 3), (7, 3)]
    runs.check_invariants(10)


def test_released_hashed_blocks_are_cached_and_evicted_least_recently_released_first() -> None:
    evicted: list[tuple[BlockId, BlockHash]] = []
    pool = BlockPool(6, hooks=PoolHooks(on_evict=evicted.extend))
    a = pool.allocate(2)  # [0, 1]
    b = pool.allocate(2)  # [2, 3]
    cache_blocks(pool, b, base=10)
    cache_blocks(pool, a, base=20)
    assert (pool.num_free, pool.num_cached) == (2, 4)
    # 2 free first, then 3 evictions: b (released first), tail block before head, then a's tail.
    assert pool.allocate(5) == [4, 5, 3, 2, 1]
    assert evicted == [(3, h(11)), (2, h(10)), (1, h(21))]
    assert pool.hash_of(BlockId(0)) == h(20) and pool.num_cached == 1
    assert pool.counters.evictions == 3
    pool.check_invariants()


def test_incref_of_a_cached_block_takes_it_out_of_the_lru() -> None:
    pool = BlockPool(2)
    blocks = pool.allocate(2)
    cache_blocks(pool, blocks)
    pool.incref(ids(0))
    assert (pool.num_cached, pool.num_in_use, pool.ref_count(BlockId(0))) == (1, 1, 1)
    assert pool.allocate(1) == [1]  # only block 1 is evictable
    with pytest.raises(OutOfBlocks):
        pool.allocate(1)
    pool.check_invariants()


def test_contiguous_request_fails_with_reason_when_runs_are_fragmented() -> None:
    pool = BlockPool(6)
    pool.allocate(6)
    pool.free(ids(0, 2, 4))
    with pytest.raises(OutOfBlocks) as err:
        pool.allocate(2, contiguous=True)
    assert err.value.reason == "no_contiguous_block" and err.value.requested == 2
    assert pool.free_run_sizes() == [1, 1, 1] and pool.num_in_use == 3  # unchanged
    assert pool.counters.oom_by_reason == {"no_contiguous_block": 1}
    assert pool.allocate(2) == [0, 2]  # scattered is fine
    pool.check_invariants()


def test_contiguous_request_evicts_the_cheapest_window_of_cached_blocks() -> None:
    pool = BlockPool(8)
    pool.allocate(8)
    cache_blocks(pool, ids(1, 2, 5))  # cached: 1, 2, 5
    pool.free(ids(4, 6))  # free: 4, 6; in use: 0, 3, 7
    assert pool.allocate(3, contiguous=True) == [4, 5, 6]  # evicts only block 5
    assert pool.num_cached == 2 and pool.hash_of(BlockId(1)) is not None
    pool.check_invariants()


def test_oom_reasons_distinguish_pinned_prefix_from_full_pool() -> None:
    pool = BlockPool(4)
    prefix = pool.allocate(2)
    for i, b in enumerate(prefix):
        pool.set_hash(b, h(i))  # hashed and still referenced: a pinned prefix
    pool.allocate(1)
    with pytest.raises(OutOfBlocks) as err:
        pool.allocate(3, seq_len=600)
    assert err.value.reason == "ref_count_lock"
    pool.allocate(1)
    pool.free(prefix)  # prefix cached now: evictable, so this fits
    assert sorted(pool.allocate(2)) == [0, 1]
    with pytest.raises(OutOfBlocks) as err:
        pool.allocate(1)
    assert err.value.reason == "no_free_block"
    assert pool.counters.oom_by_reason == {"ref_count_lock": 1, "no_free_block": 1}
    assert pool.counters.oom_by_seq_len == {"1024": 1, "unknown": 1}
    pool.check_invariants()


def test_request_larger_than_the_pool_is_no_free_block() -> None:
    pool = BlockPool(4)
    with pytest.raises(OutOfBlocks) as err:
        pool.allocate(5)
    assert err.value.reason == "no_free_block" and pool.num_free == 4


@pytest.mark.parametrize(
    "bad",
    [
        lambda p: p.allocate(-1),
        lambda p: p.free(ids(3)),  # free block
        lambda p: p.free(ids(0, 0)),  # ref 1, freed twice
        lambda p: p.free(ids(0, 9)),  # out of range
        lambda p: p.free(ids(-1)),  # negative ids would wrap around in a list
        lambda p: p.incref(ids(0, 3)),  # 3 is free
        lambda p: p.set_hash(BlockId(3), h(1)),  # not in use
        lambda p: p.evict(-1),
        lambda p: p.record_preemption(-5),
    ],
)
def test_bad_input_raises_value_error_and_changes_nothing(bad) -> None:  # type: ignore[no-untyped-def]
    pool = BlockPool(4)
    pool.allocate(2)
    before = (pool.ref_counts(), pool.free_run_sizes(), pool.num_cached)
    with pytest.raises(ValueError):
        bad(pool)
    assert (pool.ref_counts(), pool.free_run_sizes(), pool.num_cached) == before
    pool.check_invariants()


def test_constructor_validates() -> None:
    with pytest.raises(ValueError, match="num_blocks"):
        BlockPool(0)
    with pytest.raises(ValueError, match="idle_ttl_s"):
        PoolConfig(idle_ttl_s=-1)
    with pytest.raises(ValueError, match="gc_trigger_free_run_blocks"):
        PoolConfig(gc_trigger_free_run_blocks=-1)


def test_gc_phase_one_marks_only_blocks_idle_past_the_ttl() -> None:
    clock = Clock()
    pool = BlockPool(4, config=PoolConfig(idle_ttl_s=10), clock=clock)
    pool.allocate(4)
    cache_blocks(pool, ids(0))
    clock.now = 8
    cache_blocks(pool, ids(1), base=1)
    pool.free(ids(2))  # free run [2] borders 1; block 3 stays in use
    clock.now = 15  # block 0 idle 15 s, block 1 idle 7 s
    assert pool.gc() == 0  # 0 is a candidate but borders no free run; 1 is not idle enough
    clock.now = 18.5
    assert pool.gc() == 2  # 1 borders [2]; evicting it makes 0 border the run
    assert pool.free_run_sizes() == [3] and pool.num_cached == 0
    assert pool.counters.gc_runs == 2
    pool.check_invariants()


def test_gc_phase_two_leaves_isolated_idle_blocks_cached() -> None:
    clock = Clock()
    pool = BlockPool(5, config=PoolConfig(idle_ttl_s=1), clock=clock)
    pool.allocate(5)
    cache_blocks(pool, ids(0, 2))
    pool.free(ids(3))  # in use: 1, 4
    clock.now = 5
    assert pool.gc() == 1  # 2 borders [3]; 0 is enclosed by in-use blocks and stays matchable
    assert pool.hash_of(BlockId(0)) is not None and pool.free_run_sizes() == [2]
    pool.check_invariants()


def test_allocation_triggers_gc_when_the_largest_run_is_short() -> None:
    clock = Clock()
    cfg = PoolConfig(idle_ttl_s=1, gc_trigger_free_run_blocks=3, gc_min_interval_s=10)
    pool = BlockPool(6, config=cfg, clock=clock)
    pool.allocate(6)
    cache_blocks(pool, ids(1, 2))
    pool.free(ids(0, 3))  # runs [0], [3]; cached 1, 2 between them
    clock.now = 2
    assert pool.allocate(1) == [0]  # interval not elapsed since construction: no GC yet
    assert pool.counters.gc_runs == 0
    clock.now = 12
    pool.free(ids(0))
    assert pool.allocate(4, contiguous=True) == [0, 1, 2, 3]  # GC coalesced 0..3 first
    assert pool.counters.gc_runs == 1 and pool.counters.evictions == 2
    assert pool.counters.gc_auto_runs == 1
    pool.gc()
    assert (pool.counters.gc_runs, pool.counters.gc_auto_runs) == (2, 1)  # a called GC is not automatic
    pool.check_invariants()


def test_gc_trigger_in_bytes_rounds_up_to_blocks_and_takes_the_larger() -> None:
    assert BlockPool(8, block_bytes=100, config=PoolConfig(gc_trigger_free_run_bytes=250)).gc_trigger_blocks == 3
    cfg = PoolConfig(gc_trigger_free_run_blocks=5, gc_trigger_free_run_bytes=250)
    assert BlockPool(8, block_bytes=100, config=cfg).gc_trigger_blocks == 5
    assert BlockPool(8, config=PoolConfig(gc_trigger_free_run_bytes=250)).gc_trigger_blocks == 0  # no byte size
    with pytest.raises(ValueError, match="gc_trigger_free_run_bytes"):
        PoolConfig(gc_trigger_free_run_bytes=-1)


def test_host_tier_pool_and_preemption_counters() -> None:
    pool = BlockPool(3, tier=Tier.HOST, block_bytes=64)
    pool.record_preemption(128)
    assert pool.tier == Tier.HOST and pool.counters.preemptions == 1
    assert pool.counters.swapped_to_host_bytes == 128


def test_explicit_evict_moves_cached_blocks_to_free_runs() -> None:
    pool = BlockPool(3)
    cache_blocks(pool, pool.allocate(3))
    assert pool.evict(5) == 3
    assert pool.free_run_sizes() == [3] and pool.ghost_blocks() == 0
    pool.check_invariants()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 8), st.booleans()), max_size=40))
def test_free_runs_agree_with_a_set_of_free_ids(ops: list[tuple[bool, int, bool]]) -> None:
    """Random takes (best fit / scattered) and frees against a plain set of free ids."""
    runs, free, held = FreeRuns(16), set(range(16)), []
    for take, n, contiguous in ops:
        if take and n <= len(free):
            got = runs.take_run(n) if contiguous else runs.take(n)
            if got is None:  # best fit found no run: then no n consecutive free ids exist
                assert not any(all(b + i in free for i in range(n)) for b in range(16))
                continue
            assert len(got) == n and set(got) <= free
            if contiguous:
                assert got == list(range(got[0], got[0] + n))
            free -= set(got)
            held.append(got)
        elif held:
            back = held.pop(n % len(held))
            runs.add(back)
            free |= set(back)
        runs.check_invariants(16)
        assert {b for s, ln in runs.runs() for b in range(s, s + ln)} == free


def test_a_group_pinned_and_released_again_moves_to_the_lru_tail_whole() -> None:
    clock = Clock()
    pool = BlockPool(6, config=PoolConfig(idle_ttl_s=5.0), clock=clock)
    a, b = pool.allocate(2), pool.allocate(2)  # [0, 1], [2, 3]
    cache_blocks(pool, a, base=10)  # group (1, 0), released at t=0
    cache_blocks(pool, b, base=20)  # group (3, 2), released at t=0
    clock.now = 10.0
    pool.pin(a)  # a prefix match of a ...
    pool.free(a)  # ... released as the same group: renewed at t=10
    assert pool.num_cached == 4 and pool.num_in_use == 0
    assert [bl for bl in range(6) if pool.ref_count(BlockId(bl))] == []
    assert pool.allocate(3) == [4, 5, 3]  # b, released before a's renewal, is evicted first
    pool.free(ids(4, 5, 3))
    assert pool.gc() == 1  # idle since t=0: block 2 goes; a was renewed at t=10, so it stays
    assert pool.hash_of(BlockId(0)) == h(10) and pool.hash_of(BlockId(1)) == h(11)
    assert pool.allocate(5) == [2, 3, 4, 5, 1]
    pool.check_invariants()


def test_a_renewed_group_released_twice_is_refused_and_unchanged() -> None:
    pool = BlockPool(4)
    a = pool.allocate(3)
    cache_blocks(pool, a)
    pool.pin(a)
    pool.free(a)  # renewal: back to ref 0
    before = (pool.ref_counts(), pool.num_cached, pool.num_in_use)
    with pytest.raises(ValueError, match="not in use"):
        pool.free(a)
    pool.pin(a[:2])
    with pytest.raises(ValueError, match="not in use"):
        pool.free(a)  # block 2 is cached, not held
    pool.free(a[:2])  # a sub-prefix is not the group: released one block at a time, correctly
    assert (pool.ref_counts(), pool.num_cached, pool.num_in_use) == before
    assert pool.allocate(2) == [3, 2]  # free block first, then the LRU's oldest: the group's tail
    pool.check_invariants()
