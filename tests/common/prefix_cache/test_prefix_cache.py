"""PrefixCache: longest-prefix match with pinning, insert with duplicates, events, lazy eviction."""

from collections.abc import Sequence

import pytest

from radixmesh.common.block_pool.block_pool import BlockPool, OutOfBlocks
from radixmesh.common.prefix_cache.prefix_cache import EvictedBlock, PrefixCache
from radixmesh.proto.block_hash import BlockHash, hash_blocks
from radixmesh.proto.events import BlockRemoved, BlockStored, Tier
from radixmesh.proto.ids import BlockId

CHAIN = hash_blocks(list(range(64)), 16)  # 4 chained hashes
OTHER = hash_blocks(list(range(100, 164)), 16)


def filled(num_blocks: int = 8) -> tuple[PrefixCache, list[BlockId]]:
    """A cache holding CHAIN in freshly allocated blocks, still referenced by the caller."""
    cache = PrefixCache(BlockPool(num_blocks))
    blocks = cache.pool.allocate(4)
    cache.insert(CHAIN, blocks)
    return cache, blocks


def test_match_returns_the_longest_prefix_and_pins_it() -> None:
    cache, blocks = filled()
    cache.release(blocks)
    probe = [*CHAIN[:2], OTHER[2], CHAIN[3]]
    got = cache.match(probe)
    assert got == blocks[:2]
    assert [cache.pool.ref_count(b) for b in blocks] == [1, 1, 0, 0]
    assert cache.longest_prefix(CHAIN) == 4 and cache.longest_prefix(OTHER) == 0
    assert (cache.query_blocks, cache.hit_blocks) == (4, 2)
    cache.release(got)
    cache.check_invariants()


def test_released_prefix_stays_matchable_until_its_space_is_needed() -> None:
    cache, blocks = filled(num_blocks=4)
    cache.release(blocks)
    assert cache.pool.num_cached == 4 and cache.longest_prefix(CHAIN) == 4
    cache.take_events()
    new = cache.pool.allocate(1)  # pool is all cached: evicts the tail block of the chain
    assert new == [blocks[3]]
    assert cache.longest_prefix(CHAIN) == 3
    assert cache.take_events() == [BlockRemoved((CHAIN[3],), Tier.GPU)]
    cache.check_invariants()


def test_pinned_blocks_are_never_evicted() -> None:
    cache, blocks = filled(num_blocks=4)
    cache.release(blocks)
    pinned = cache.match(CHAIN[:2])
    assert sorted(cache.pool.allocate(2)) == sorted(blocks[2:])
    with pytest.raises(OutOfBlocks) as err:
        cache.pool.allocate(1)
    assert err.value.reason == "ref_count_lock"
    assert cache.longest_prefix(CHAIN) == 2
    cache.release(pinned)
    cache.check_invariants()


def test_insert_emits_stored_with_parent_and_keeps_existing_duplicates() -> None:
    cache, blocks = filled(num_blocks=10)
    assert cache.take_events() == [BlockStored(tuple(CHAIN), None, Tier.GPU)]
    # A second sequence computed the same chain plus one more block (next 16 tokens).
    more = hash_blocks(list(range(80)), 16)
    dup = cache.pool.allocate(5)
    cache.insert(more, dup)
    assert cache.take_events() == [BlockStored((more[4],), more[3], Tier.GPU)]
    assert cache.match(more) == [*blocks, dup[4]]
    cache.release(dup)  # the four duplicates were never hashed: freed, not cached
    assert cache.pool.num_free == 10 - 5 and cache.pool.num_cached == 0
    cache.check_invariants()


def test_insert_splits_events_around_hashes_already_cached() -> None:
    cache = PrefixCache(BlockPool(8))
    mid = cache.pool.allocate(1)
    cache.insert([CHAIN[1]], mid, parent=CHAIN[0])
    cache.take_events()
    blocks = cache.pool.allocate(4)
    cache.insert(CHAIN, blocks)
    assert cache.take_events() == [
        BlockStored((CHAIN[0],), None, Tier.GPU),
        BlockStored((CHAIN[2], CHAIN[3]), CHAIN[1], Tier.GPU),
    ]
    assert cache.snapshot() == [
        (CHAIN[1], CHAIN[0]),
        (CHAIN[0], None),
        (CHAIN[2], CHAIN[1]),
        (CHAIN[3], CHAIN[2]),
    ]
    cache.check_invariants()


@pytest.mark.parametrize(
    "bad",
    [
        lambda c, b: c.insert(CHAIN[:2], b[:1]),  # lengths differ
        lambda c, b: c.insert([OTHER[0], OTHER[0]], b[:2]),  # repeated hash
        lambda c, b: c.insert(OTHER[:2], [b[0], b[0]]),  # repeated block
        lambda c, b: c.insert(OTHER[:1], [BlockId(7)]),  # block not held (free)
        lambda c, b: c.insert(OTHER[:1], b[:1]),  # block already named by CHAIN[0]
        lambda c, b: c.insert(OTHER[:1], [BlockId(99)]),  # out of range
        lambda c, b: c.release([BlockId(7)]),  # free block
    ],
)
def test_bad_input_raises_and_changes_nothing(bad) -> None:  # type: ignore[no-untyped-def]
    cache, blocks = filled()
    cache.take_events()
    before = (cache.pool.ref_counts(), cache.snapshot())
    with pytest.raises(ValueError):
        bad(cache, blocks)
    assert (cache.pool.ref_counts(), cache.snapshot()) == before
    assert cache.take_events() == []
    cache.check_invariants()


def test_gc_evictions_emit_block_removed_and_snapshot_follows() -> None:
    now = [0.0]
    pool = BlockPool(6, clock=lambda: now[0])
    cache = PrefixCache(pool)
    blocks = pool.allocate(4)
    cache.insert(CHAIN, blocks)
    cache.release(blocks)
    cache.take_events()
    now[0] = 100.0
    assert pool.gc() == 4  # all idle past the 30 s default TTL, and the chain borders free run [4, 5]
    removed = cache.take_events()
    assert all(isinstance(e, BlockRemoved) for e in removed)
    assert sorted(h for e in removed for h in e.hashes) == sorted(CHAIN)  # type: ignore[union-attr]
    assert cache.snapshot() == [] and len(cache) == 0
    cache.check_invariants()


def test_match_of_nothing_pins_nothing() -> None:
    cache, _ = filled()
    assert cache.match([]) == [] and cache.match([BlockHash(b"\x00" * 16)]) == []
    assert cache.pool.num_in_use == 4


def test_on_evict_sees_each_block_with_its_parent_before_its_slot_is_reused() -> None:
    pool = BlockPool(4)
    seen: list[tuple[EvictedBlock, bool, int]] = []

    def hook(evicted: Sequence[EvictedBlock]) -> None:
        # Called inside allocate: the blocks have left the table but are not free or handed out yet.
        seen.extend((e, e.hash in cache, pool.num_free) for e in evicted)

    cache = PrefixCache(pool, on_evict=hook)
    blocks = pool.allocate(4)
    cache.insert(CHAIN, blocks)
    cache.release(blocks)
    assert CHAIN[3] in cache
    got = pool.allocate(2)  # the chain's tail goes first
    assert got == [blocks[3], blocks[2]]
    assert seen == [
        (EvictedBlock(blocks[3], CHAIN[3], CHAIN[2]), False, 0),
        (EvictedBlock(blocks[2], CHAIN[2], CHAIN[1]), False, 0),
    ]
    assert CHAIN[3] not in cache and cache.longest_prefix(CHAIN) == 2
    pool.free(got)
    cache.check_invariants()
