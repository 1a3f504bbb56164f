"""Random allocate / match / insert / release / fork / gc / evict sequences against an oracle.

The oracle keeps per-block refcounts and hashes in plain lists, the LRU as a plain list in release
order and the hash table as a dict, and predicts every outcome (which blocks are evicted, which
prefix matches, which OOM reason) before the real pool and cache run. `check_invariants()` and the
ghost-block count run after every step, and the events replayed into a set must equal the table.
"""

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from radixmesh.common.block_pool.block_pool import BlockPool, OutOfBlocks
from radixmesh.common.block_pool.config import PoolConfig
from radixmesh.common.prefix_cache.prefix_cache import PrefixCache
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.events import BlockRemoved, BlockStored
from radixmesh.proto.ids import BlockId

pytestmark = pytest.mark.slow

N = 12
TTL = 5.0
DOCS = 3
DOC_LEN = 6


def doc_hash(doc: int, i: int) -> BlockHash:
    return BlockHash(bytes([doc, i]) * 8)


class Oracle:
    """The memory model, written the slow obvious way."""

    def __init__(self) -> None:
        self.ref = [0] * N
        self.hash: list[BlockHash | None] = [None] * N
        self.lru: list[int] = []  # cached blocks, least recently released first
        self.released_at: dict[int, float] = {}
        self.table: dict[BlockHash, int] = {}

    def free(self) -> list[int]:
        return [b for b in range(N) if self.ref[b] == 0 and self.hash[b] is None]

    def window_cost(self, n: int) -> int | None:
        """Fewest cached blocks inside any window of n ref-0 blocks (None: no such window)."""
        costs = [
            sum(b in self.lru for b in range(s, s + n))
            for s in range(N - n + 1)
            if all(self.ref[b] == 0 for b in range(s, s + n))
        ]
        return min(costs) if costs else None

    def oom_reason(self, n: int, contiguous: bool) -> str | None:
        avail = len(self.free()) + len(self.lru)
        if n > avail:
            pinned = sum(1 for b in range(N) if self.ref[b] and self.hash[b] is not None)
            return "ref_count_lock" if avail + pinned >= n else "no_free_block"
        if contiguous and self.window_cost(n) is None:
            return "no_contiguous_block"
        return None

    def drop(self, b: int) -> None:
        """Evict cached block b."""
        self.lru.remove(b)
        h = self.hash[b]
        assert h is not None
        del self.table[h]
        self.hash[b] = None

    def release(self, blocks: list[int], now: float) -> None:
        for b in blocks:
            self.ref[b] -= 1
        for b in reversed(blocks):
            if self.ref[b] == 0 and self.hash[b] is not None and b not in self.lru:
                self.lru.append(b)
                self.released_at[b] = now

    def pin(self, blocks: list[int]) -> None:
        for b in blocks:
            if self.ref[b] == 0:
                self.lru.remove(b)
            self.ref[b] += 1

    def gc(self, now: float) -> int:
        candidates = {b for b in self.lru if self.released_at[b] < now - TTL}
        evicted = 0
        changed = True
        while changed:
            changed = False
            free = set(self.free())
            for b in sorted(candidates):
                if b - 1 in free or b + 1 in free:
                    candidates.remove(b)
                    self.drop(b)
                    evicted += 1
                    changed = True
                    break
        return evicted


class MemoryMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        # The oracle's eviction order is exactly LRU, whatever the pool's default order is.
        config = PoolConfig(eviction="lru", idle_ttl_s=TTL)
        self.pool = BlockPool(N, block_bytes=64, config=config, clock=lambda: self.now)
        self.cache = PrefixCache(self.pool)
        self.model = Oracle()
        self.holdings: list[list[BlockId]] = []  # each holds one reference per block
        self.indexed: set[BlockHash] = set()  # the table as seen through events alone

    @rule(n=st.integers(1, N + 1), contiguous=st.booleans())
    def allocate(self, n: int, contiguous: bool) -> None:
        m = self.model
        reason = m.oom_reason(n, contiguous)
        free_before, lru_before = set(m.free()), list(m.lru)
        cost = m.window_cost(n) if contiguous else None
        try:
            got = self.pool.allocate(n, contiguous=contiguous)
        except OutOfBlocks as err:
            assert err.reason == reason, (err.reason, reason)
            return
        assert reason is None, f"oracle predicted {reason}"
        assert len(got) == n == len(set(got))
        assert set(got) <= free_before | set(lru_before)
        evicted = [b for b in got if b in lru_before]
        if contiguous:
            assert got == list(range(got[0], got[0] + n))
            assert len(evicted) == cost
        else:
            assert sorted(evicted) == sorted(lru_before[: max(0, n - len(free_before))])
        for b in evicted:
            m.drop(b)
        for b in got:
            m.ref[b] = 1
        self.holdings.append(got)

    @precondition(lambda self: self.holdings)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        held = self.holdings.pop(data.draw(st.integers(0, len(self.holdings) - 1)))
        self.cache.release(held)
        self.model.release(held, self.now)

    @rule(doc=st.integers(0, DOCS - 1), k=st.integers(0, DOC_LEN))
    def match(self, doc: int, k: int) -> None:
        hashes = [doc_hash(doc, i) for i in range(k)]
        expected: list[int] = []
        for h in hashes:
            if h not in self.model.table:
                break
            expected.append(self.model.table[h])
        got = self.cache.match(hashes)
        assert got == expected
        self.model.pin(expected)
        if got:
            self.holdings.append(got)

    @rule(doc=st.integers(0, DOCS - 1), k=st.integers(1, DOC_LEN))
    def peek(self, doc: int, k: int) -> None:
        """Pin a cached prefix and unpin it at once, as a transfer source or a promotion does; the
        second peek of a prefix releases exactly the group the first one formed (LRU renewal)."""
        got = self.cache.match([doc_hash(doc, i) for i in range(k)])
        self.model.pin(got)
        self.cache.release(got)
        self.model.release(got, self.now)

    @precondition(lambda self: self.holdings)
    @rule(data=st.data(), doc=st.integers(0, DOCS - 1))
    def insert(self, data: st.DataObject, doc: int) -> None:
        held = self.holdings[data.draw(st.integers(0, len(self.holdings) - 1))][:DOC_LEN]
        hashes = [doc_hash(doc, i) for i in range(len(held))]
        m = self.model
        bad = any(m.table.get(h) != b and m.hash[b] is not None for h, b in zip(hashes, held, strict=True))
        try:
            self.cache.insert(hashes, held)
        except ValueError:
            assert bad
            return
        assert not bad
        for h, b in zip(hashes, held, strict=True):
            if h not in m.table:
                m.table[h] = b
                m.hash[b] = h

    @precondition(lambda self: self.holdings)
    @rule(data=st.data())
    def fork(self, data: st.DataObject) -> None:
        held = self.holdings[data.draw(st.integers(0, len(self.holdings) - 1))]
        self.pool.incref(held)
        self.model.pin(held)
        self.holdings.append(list(held))

    @rule(dt=st.sampled_from([0.0, 1.0, 3.0, 6.0]))
    def gc(self, dt: float) -> None:
        self.now += dt
        assert self.pool.gc() == self.model.gc(self.now)

    @rule(k=st.integers(0, 4))
    def evict(self, k: int) -> None:
        expected = self.model.lru[:k]
        assert self.pool.evict(k) == len(expected)
        for b in expected:
            self.model.drop(b)

    @rule(b=st.integers(-1, N))
    def bad_free(self, b: int) -> None:
        if 0 <= b < N and self.model.ref[b] > 0:
            return
        before = self.pool.ref_counts()
        try:
            self.cache.release([BlockId(b)])
        except ValueError:
            assert self.pool.ref_counts() == before
        else:
            raise AssertionError(f"release of free block {b} was accepted")

    @invariant()
    def agrees_with_oracle(self) -> None:
        self.cache.check_invariants()
        assert self.pool.ghost_blocks() == 0
        m = self.model
        assert self.pool.ref_counts() == m.ref
        assert self.pool.num_cached == len(m.lru) and self.pool.num_free == len(m.free())
        named = {self.pool.hash_of(BlockId(b)): b for b in range(N) if self.pool.hash_of(BlockId(b))}
        assert named == m.table and {h for h, _ in self.cache.snapshot()} == set(m.table)
        for event in self.cache.take_events():
            if isinstance(event, BlockStored):
                self.indexed.update(event.hashes)
            elif isinstance(event, BlockRemoved):
                self.indexed.difference_update(event.hashes)
        assert self.indexed == set(m.table)


MemoryMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestMemoryStateful = MemoryMachine.TestCase
