"""Sequences: prefix reuse through the cache, growth, fork with copy-on-write, release."""

import pytest

from radixmesh.common.block_pool.block_pool import BlockPool, OutOfBlocks
from radixmesh.common.prefix_cache.block_table import BlockCopy, SequenceManager
from radixmesh.common.prefix_cache.prefix_cache import PrefixCache
from radixmesh.proto.block_hash import hash_blocks
from radixmesh.proto.ids import BlockId


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


def test_sequences_share_a_prefix_only_under_the_same_salt() -> None:
    sm = manager()
    a = sm.start(list(range(8)), salt=b"tenant-a")
    sm.commit(a)
    assert sm.start(list(range(8)), salt=b"tenant-b").num_cached_blocks == 0
    assert sm.start(list(range(8)), salt=b"tenant-a").num_cached_blocks == 2
    assert a.hashes == hash_blocks(list(range(8)), 4, salt=b"tenant-a")
    sm.cache.check_invariants()


def test_chunked_growth_commits_only_the_placed_and_written_blocks() -> None:
    sm = manager()
    s = sm.create(list(range(10)))  # 10 tokens, no block yet
    assert s.block_table == [] and sm.cache.pool.num_in_use == 0
    sm.reserve(s, 4)  # first chunk: tokens [0, 4)
    assert s.block_table == [0]
    sm.commit(s, 4)
    assert s.num_committed == 1 and sm.cache.longest_prefix(hash_blocks(list(range(8)), 4)) == 1
    with pytest.raises(ValueError, match="holding 1 blocks"):
        sm.commit(s, 8)  # tokens [4, 8) have no block yet
    sm.reserve(s, 10)
    assert s.block_table == [0, 1, 2]
    sm.commit(s)
    assert s.num_committed == 2 and sm.cache.longest_prefix(s.hashes) == 2
    sm.release(s)
    sm.cache.check_invariants()


def test_dropped_blocks_leave_a_live_sequence_that_can_be_placed_again() -> None:
    sm = manager()
    s = sm.start(list(range(9)))
    sm.commit(s)
    sm.drop_blocks(s)
    assert s.block_table == [] and not s.released and s.num_committed == 0
    assert sm.cache.pool.num_in_use == 0 and sm.cache.pool.num_cached == 2
    prefix = sm.cache.match(sm.block_hashes(s, 2))
    sm.attach_prefix(s, prefix)
    assert (s.block_table, s.num_cached_blocks, s.num_committed) == ([0, 1], 2, 2)
    with pytest.raises(ValueError, match="already holds"):
        sm.attach_prefix(s, [])
    sm.reserve(s, 9)
    assert len(s.block_table) == 3
    sm.release(s)
    assert sm.cache.pool.num_in_use == 0
    sm.cache.check_invariants()


def test_a_sequence_created_with_its_hashes_hashes_only_the_blocks_past_them() -> None:
    sm = manager()
    tokens = list(range(10))
    given = hash_blocks(tokens, 4)  # the 2 full blocks, as the agent hashes a prompt
    s = sm.create(tokens, hashes=given)
    assert s.hashes == given
    sm.reserve(s, 13)
    sm.append(s, [10, 11, 12])
    assert sm.block_hashes(s, 3) == hash_blocks([*tokens, 10, 11], 4)
    with pytest.raises(ValueError, match="3 block hashes"):
        sm.create(tokens, hashes=hash_blocks([*tokens, 10, 11], 4))
