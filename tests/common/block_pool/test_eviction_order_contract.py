"""The EvictionOrder contract (common/block_pool/eviction.py), one suite run against every registered
order: which blocks are members, what pop_oldest / oldest / released_before return, demotion, and the
pool's fast release path (group_of + renew), against a plain-dict oracle under random operations.
How each order ranks re-used blocks differs by design and is pinned in their own modules."""

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixmesh.common.block_pool.eviction import EVICTION_ORDERS, EvictionOrder, make_eviction_order
from radixmesh.proto.block_hash import BlockHash
from tests.support.hashes import h

NEG_INF = float("-inf")


ORDERS = pytest.mark.parametrize("name", sorted(EVICTION_ORDERS))
"""Every registered order (a parametrize, not a fixture: hypothesis reruns one test body per example)."""


class Run:
    """One order over a pool of `n` blocks, with the oracle: release time of every member, the blocks
    pinned since they were members (stamped, not members), the rest free."""

    def __init__(self, name: str, n: int) -> None:
        self.ref = [0] * n
        self.hashes: list[BlockHash | None] = [None] * n
        self.order: EvictionOrder = make_eviction_order(name, self.ref, self.hashes)
        self.members: dict[int, float] = {}
        self.pinned: set[int] = set()
        self.now = 0.0
        self._keys = iter(range(1 << 30))

    def free(self) -> list[int]:
        return [b for b in range(len(self.ref)) if b not in self.members and b not in self.pinned]

    def store(self, blocks: list[int], key: Callable[[], int] | None = None) -> None:
        """Blocks computed and released once: new members, released now."""
        self.now += 1
        live = {self.hashes[b] for b in [*self.members, *self.pinned]}
        for b in blocks:
            # hashes drawn again after an eviction come back through S3-FIFO's ghost
            k = key() if key is not None else next(self._keys)
            while h(k) in live:
                k = next(self._keys) + 1000
            self.hashes[b] = h(k)
            live.add(h(k))
        self.order.push(blocks, self.now)
        self.members.update(dict.fromkeys(blocks, self.now))

    def pin(self, blocks: list[int]) -> None:
        for b in blocks:
            self.ref[b] += 1
            del self.members[b]
            self.pinned.add(b)

    def release(self, blocks: list[int]) -> None:
        """The pool's release: a group released whole is renewed, anything else pushed again."""
        self.now += 1
        for b in blocks:
            self.ref[b] -= 1
            self.pinned.discard(b)
        group = self.order.group_of(tuple(blocks))
        if group is not None:
            self.order.renew(group, self.now)
        else:
            self.order.push(blocks, self.now)
        self.members.update(dict.fromkeys(blocks, self.now))

    def pop(self, k: int) -> list[int]:
        popped = self.order.pop_oldest(k)
        assert len(popped) == len(set(popped)) == min(k, len(self.members))
        assert set(popped) <= set(self.members)
        for b in popped:
            del self.members[b]
        return popped

    def discard(self, blocks: list[int]) -> None:
        self.order.discard(blocks)
        for b in blocks:
            self.members.pop(b, None)
            if b in self.pinned:
                self.pinned.discard(b)
                self.ref[b] = 0

    def check(self, cutoff: float) -> None:
        order = self.order
        order.check_invariants()
        assert sorted(order.members()) == sorted(self.members)
        assert [b for b in range(len(self.ref)) if b in order] == sorted(self.members)
        assert sorted(order.released_before(cutoff)) == sorted(b for b, t in self.members.items() if t < cutoff)
        for n in (1, len(self.members) + 1):
            some = order.oldest(n)
            assert len(some) == len(set(some)) == min(n, len(self.members))
            assert set(some) <= set(self.members)
        assert sorted(order.members()) == sorted(self.members)  # oldest removed none


@ORDERS
@settings(max_examples=60, deadline=None)
@given(st.integers(1, 12), st.data())
def test_every_order_keeps_exactly_the_members_the_pool_gave_it(name: str, n: int, data: st.DataObject) -> None:
    run = Run(name, n)
    for _ in range(data.draw(st.integers(1, 30))):
        op = data.draw(st.sampled_from(["store", "pin", "release", "discard", "pop", "demote"]))
        members = sorted(run.members)
        if op == "store" and run.free():
            blocks = data.draw(st.lists(st.sampled_from(run.free()), min_size=1, unique=True))
            run.store(blocks, lambda: data.draw(st.integers(0, 2 * n)))
        elif op == "pin" and members:
            run.pin(data.draw(st.lists(st.sampled_from(members), min_size=1, unique=True)))
        elif op == "release" and run.pinned:
            run.release(data.draw(st.lists(st.sampled_from(sorted(run.pinned)), min_size=1, unique=True)))
        elif op == "discard" and (members or run.pinned):
            run.discard(data.draw(st.lists(st.sampled_from(members + sorted(run.pinned)), min_size=1, unique=True)))
        elif op == "pop":
            k = data.draw(st.integers(0, n))
            first = run.order.oldest(1)
            popped = run.pop(k)
            if k:
                assert popped[:1] == first  # oldest names the next victim
        elif op == "demote" and members:
            blocks = data.draw(st.lists(st.sampled_from(members), min_size=1, unique=True))
            run.order.demote(blocks)
            run.members.update(dict.fromkeys(blocks, NEG_INF))  # idle since ever, for GC
        run.check(data.draw(st.floats(run.now - 4, run.now + 1)))


@ORDERS
@settings(max_examples=40, deadline=None)
@given(st.integers(1, 16), st.data())
def test_blocks_used_once_leave_in_release_order_and_demoted_ones_first(name: str, n: int,
                                                                        data: st.DataObject) -> None:
    # Never re-used, every block sits in one queue of every order: they must agree on FIFO.
    run = Run(name, n)
    fifo: list[int] = []
    for _ in range(data.draw(st.integers(1, 20))):
        op = data.draw(st.sampled_from(["store", "pin", "pop", "demote"]))
        members = [b for b in fifo if b in run.members]
        if op == "store" and run.free():
            blocks = data.draw(st.lists(st.sampled_from(run.free()), min_size=1, unique=True))
            run.store(blocks)
            fifo += blocks
        elif op == "pin" and members:
            run.pin(data.draw(st.lists(st.sampled_from(members), min_size=1, max_size=2, unique=True)))
        elif op == "pop":
            k = data.draw(st.integers(0, n))
            assert run.pop(k) == members[:k]
            fifo = [b for b in fifo if b not in members[:k]]
        elif op == "demote" and members:
            blocks = data.draw(st.lists(st.sampled_from(members), min_size=1, unique=True))
            run.order.demote(blocks)
            fifo = blocks + [b for b in fifo if b not in blocks]
            run.members.update(dict.fromkeys(blocks, NEG_INF))
        run.check(run.now + 1)


@pytest.mark.parametrize("name", sorted(EVICTION_ORDERS))
def test_demoted_members_go_before_reused_ones(name: str) -> None:
    """(S3FIFO took main's oldest first once probation was within its share: [0, 3], where oldest(2)
    had said [0, 2].)"""
    # 20 blocks: 2 used once, 18 re-used (main, under the S3-FIFO orders); then one of each demoted.
    run = Run(name, 20)
    run.store(list(range(20)))
    run.pin(list(range(2, 20)))
    run.release(list(range(2, 20)))
    run.order.demote([0, 2])
    run.members.update({0: NEG_INF, 2: NEG_INF})
    run.check(0.0)
    assert run.order.oldest(2) == [0, 2]
    assert run.pop(2) == [0, 2]


@ORDERS
def test_pinned_blocks_are_no_members_until_released(name: str) -> None:
    run = Run(name, 4)
    run.store([0, 1, 2, 3])
    run.pin([0, 1])
    assert 0 not in run.order and 2 in run.order
    assert run.pop(4) == [2, 3]
    run.release([0, 1])
    assert sorted(run.order.members()) == [0, 1] and run.order.released_before(run.now) == []
    run.check(run.now + 1)
