"""Sequences: prefix reuse through the cache, growth, fork with copy-on-write, release."""

import pytest

from radixmesh.node_agent.block_hash import hash_blocks
from radixmesh.node_agent.block_pool import BlockPool, OutOfBlocks
from radixmesh.node_agent.ids import BlockId
from radixmesh.node_agent.prefix_cache import PrefixCache
from radixmesh.node_agent.sequence import BlockCopy, SequenceManager


def manager(num_blocks: int = 16, bs: int = 4) -> SequenceManager:
    return SequenceManager(PrefixCache(BlockPool(num_blocks)), bs)


def test_second_sequence_reuses_the_committed_prefix() -> None:
    sm = manager()
    a = sm.start(list(range(10)), reserve_tokens=2)  # 10 + 2 tokens -> 3 blocks
    assert a.block_table == [0, 1, 2] and a.num_cached_blocks == 0
    sm.commit(a)  # full blocks 0, 1
    b = sm.start([*range(8), 42])
    assert b.block_table[:2] == [0, 1] and b.num_cached_blocks == 2 and b.block_table[2] == 3
    assert sm.cache.pool.ref_count(BlockId(0)) == 2
    sm.release(a)
    sm.release(b)
    assert sm.cache.pool.num_cached == 2 and sm.cache.pool.num_in_use == 0
    sm.cache.check_invariants()


def test_append_fills_reserved_blocks_then_allocates_and_hashes_full_blocks() -> None:
    sm = manager()
    s = sm.start([1, 2, 3], reserve_tokens=1)
    assert sm.append(s, [4]) == [] and s.block_table == [0]
    assert s.hashes == hash_blocks([1, 2, 3, 4], 4)
    sm.append(s, [5, 6, 7, 8, 9])
    assert s.block_table == [0, 1, 2] and s.hashes == hash_blocks(list(range(1, 10)), 4)
    sm.commit(s)
    assert sm.cache.longest_prefix(s.hashes) == 2
    sm.cache.check_invariants()


def test_fork_shares_blocks_and_copies_the_partial_block_on_write() -> None:
    sm = manager()
    parent = sm.start(list(range(6)), reserve_tokens=2)  # blocks 0 (full), 1 (2 of 4 tokens)
    child = sm.fork(parent)
    assert child.block_table == [0, 1] and sm.cache.pool.ref_count(BlockId(1)) == 2
    copies = sm.append(child, [100])
    assert copies == [BlockCopy(BlockId(1), BlockId(2))]
    assert child.block_table == [0, 2] and parent.block_table == [0, 1]
    assert sm.cache.pool.ref_count(BlockId(1)) == 1
    assert sm.append(parent, [200]) == []  # the parent owns block 1 alone again: writes in place
    assert parent.tokens[-1] == 200 and child.tokens[-1] == 100
    sm.release(parent)
    sm.release(child)
    assert sm.cache.pool.num_free == 16
    sm.cache.check_invariants()


def test_failed_start_releases_its_pinned_prefix() -> None:
    sm = manager(num_blocks=4)
    a = sm.start(list(range(8)))
    sm.commit(a)
    before = sm.cache.pool.ref_counts()
    with pytest.raises(OutOfBlocks) as err:
        sm.start(list(range(8)), reserve_tokens=100)
    assert err.value.reason == "no_free_block"  # 25 more blocks: far beyond the 4-block pool
    assert sm.cache.pool.ref_counts() == before
    assert sm.cache.pool.counters.oom_by_seq_len == {"256": 1}
    sm.cache.check_invariants()


def test_failed_append_changes_nothing() -> None:
    sm = manager(num_blocks=2)
    s = sm.start([1, 2, 3, 4, 5])
    with pytest.raises(OutOfBlocks):
        sm.append(s, list(range(10)))
    assert s.tokens == [1, 2, 3, 4, 5] and s.block_table == [0, 1]
    sm.cache.check_invariants()


def test_bad_input_is_rejected() -> None:
    sm = manager()
    with pytest.raises(ValueError, match="token ids"):
        sm.start([1, -2])
    with pytest.raises(ValueError, match="reserve_tokens"):
        sm.start([1], reserve_tokens=-1)
    s = sm.start([1, 2])
    with pytest.raises(ValueError, match="token ids"):
        sm.append(s, [2**31])
    sm.release(s)
    with pytest.raises(ValueError, match="already released"):
        sm.release(s)
    assert sm.cache.pool.num_free == 16
    sm.cache.check_invariants()
