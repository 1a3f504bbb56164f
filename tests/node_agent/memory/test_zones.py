"""Zones: exact watermark moves of ZoneBudget, the pool's kv and prefix caps, the zone policies, and
random tick sequences checked against an oracle ledger of loans."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixmesh.common.block_pool.block_pool import BlockPool, OutOfBlocks
from radixmesh.common.prefix_cache.prefix_cache import PrefixCache
from radixmesh.node_agent.memory.zones.budget import ZONES, ZoneBudget, ZoneConfig, ZoneName
from radixmesh.node_agent.memory.zones.governor import ZoneGovernor, ZoneSetup
from radixmesh.node_agent.memory.zones.policy import make_zone_policy
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.ids import BlockId
from tests.support.hashes import h

KV, PREFIX, ACT, WEIGHTS = ZoneName.KV, ZoneName.PREFIX, ZoneName.ACTIVATIONS, ZoneName.WEIGHTS


def budget(kv: int = 1000, prefix: int = 1000, **cfg: float) -> ZoneBudget:
    return ZoneBudget({WEIGHTS: 500, ACT: 100, KV: kv, PREFIX: prefix}, ZoneConfig(**cfg))


def test_config_validates() -> None:
    with pytest.raises(ValueError, match="low_watermark < high_watermark"):
        ZoneConfig(high_watermark=0.5, low_watermark=0.6)
    with pytest.raises(ValueError, match="borrow_step"):
        ZoneConfig(borrow_step=0)
    with pytest.raises(ValueError, match="base allotment"):
        ZoneBudget({KV: 1})
    with pytest.raises(ValueError, match="unknown zone policy"):
        ZoneSetup(policy="lru")


def test_a_hot_zone_borrows_one_step_from_a_cold_one() -> None:
    b = budget(borrow_step=0.05)
    # kv at 0.9 > 0.85, prefix at 0.2 < 0.5: kv borrows 5% of prefix's base (1000), rate-limited.
    assert b.tick(0.0, {KV: 900, PREFIX: 200}) == [(KV, PREFIX, 50)]
    assert (b.allotted(KV), b.allotted(PREFIX)) == (1050, 950)
    assert b.tick(0.5, {KV: 900, PREFIX: 200}) == []  # within borrow_interval_s
    assert b.tick(1.0, {KV: 900, PREFIX: 200}) == [(KV, PREFIX, 50)]
    assert b[KV].borrows == 2 and b.loans == {(KV, PREFIX): 100}
    b.check_invariants()


def test_borrowing_stops_at_the_middle_of_the_watermarks() -> None:
    b = budget(borrow_step=1.0)
    # kv needs used / (0.675) = 1334 bytes to sit between the watermarks: it takes 334, no more.
    assert b.tick(0.0, {KV: 900, PREFIX: 100}) == [(KV, PREFIX, 334)]


def test_a_lender_never_goes_below_its_low_watermark() -> None:
    b = budget(borrow_step=1.0)
    # prefix uses 450 of 1000: it may lend only down to 900 (450 / 0.5).
    assert b.tick(0.0, {KV: 990, PREFIX: 450}) == [(KV, PREFIX, 100)]
    assert b[PREFIX].used / b.allotted(PREFIX) == 0.5


def test_a_borrower_below_low_returns_what_it_does_not_need() -> None:
    b = budget(borrow_step=1.0)
    b.tick(0.0, {KV: 900, PREFIX: 100})  # kv 1334, prefix 666
    # kv falls to 400: it keeps 800 (400 / 0.5), returns 534 of its 334 loan -> all of it.
    assert b.tick(1.0, {KV: 400, PREFIX: 100}) == [(PREFIX, KV, 334)]
    assert b.loans == {} and b.allotted(KV) == 1000 and b[KV].returns == 1
    b.check_invariants()


def test_a_partial_return_keeps_the_borrower_at_low() -> None:
    b = budget(borrow_step=1.0)
    b.tick(0.0, {KV: 900, PREFIX: 100})  # kv allotted 1334
    assert b.tick(1.0, {KV: 600, PREFIX: 100}) == [(PREFIX, KV, 134)]  # keeps 1200 = 600 / 0.5
    assert b.loans == {(KV, PREFIX): 200}


def test_a_lender_above_high_recalls_at_once() -> None:
    b = budget(borrow_step=1.0)
    b.tick(0.0, {KV: 900, PREFIX: 100})  # prefix lent 334, allotted 666
    assert b.tick(0.1, {KV: 900, PREFIX: 600}) == [(PREFIX, KV, 334)]
    assert b.allotted(PREFIX) == 1000 and b.loans == {}


def test_weights_and_activations_neither_lend_nor_borrow() -> None:
    b = budget(borrow_step=1.0)
    # activations at 1.0 (above high) and weights at 0 (below low): neither moves.
    assert b.tick(0.0, {WEIGHTS: 0, ACT: 100, KV: 500, PREFIX: 500}) == []


@st.composite
def usage(draw: st.DrawFn) -> dict[ZoneName, int]:
    return {KV: draw(st.integers(0, 1400)), PREFIX: draw(st.integers(0, 1400)), ACT: draw(st.integers(0, 100))}


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 2), usage()), max_size=30),
       st.floats(0.01, 1.0), st.sampled_from([0.0, 0.5, 1.0]))
def test_random_ticks_match_an_oracle_ledger(ticks: list[tuple[float, dict[ZoneName, int]]], step: float,
                                             interval: float) -> None:
    """The oracle applies the moves tick reports to its own ledger (base + in - out per zone) and
    checks each against the rules: a borrow takes at most one step of the lender's base, leaves the
    lender at or under `low`, and comes at most once per interval per zone; a return leaves the
    borrower at or under `low`; a recall happens only when the lender is above `high`."""
    cfg = ZoneConfig(borrow_step=step, borrow_interval_s=interval)
    b = budget(borrow_step=step, borrow_interval_s=interval)
    base = {z: b[z].base for z in ZONES}
    loans: dict[tuple[ZoneName, ZoneName], int] = {}
    last_borrow: dict[ZoneName, float] = {}
    now = 0.0
    for dt, used in ticks:
        now += dt
        before = {z: b.allotted(z) for z in ZONES}
        moves = b.tick(now, used)
        for to, frm, n in moves:
            assert n > 0 and {to, frm} == {KV, PREFIX}
            if (to, frm) in loans or (frm, to) not in loans:  # a borrow: to takes from frm
                assert n <= int(step * base[frm])
                assert now - last_borrow.get(to, -math.inf) >= interval
                last_borrow[to] = now
                loans[(to, frm)] = loans.get((to, frm), 0) + n
            else:  # frm gives back to the lender `to`
                loans[(frm, to)] -= n
                if not loans[(frm, to)]:
                    del loans[(frm, to)]
        assert b.loans == loans
        for z in ZONES:
            expect = base[z] + sum(n for (x, _), n in loans.items() if x == z) - sum(
                n for (_, x), n in loans.items() if x == z)
            assert b.allotted(z) == expect
        for to, frm, _ in moves:
            if (to, frm) in loans and before[frm] > b.allotted(frm):  # frm lent this tick
                assert used[frm] <= cfg.low_watermark * b.allotted(frm)
        b.check_invariants()


# --- the pool's caps --------------------------------------------------------------------------


def cached_pool(n: int, cached: int) -> PrefixCache:
    """A pool of n blocks whose blocks 0..cached-1 are cached, released in id order."""
    cache = PrefixCache(BlockPool(n))
    ids = cache.pool.allocate(cached)
    cache.insert([h(i) for i in ids], ids)
    for b in ids:
        cache.release([b])
    return cache


def test_kv_cap_refuses_with_zone_limit_and_changes_nothing() -> None:
    pool = BlockPool(10)
    pool.set_zone_limits(4, None)
    held = pool.allocate(3)
    with pytest.raises(OutOfBlocks) as err:
        pool.allocate(2, seq_len=100)
    assert err.value.reason == "zone_limit" and pool.counters.oom_by_reason == {"zone_limit": 1}
    assert pool.num_in_use == 3 and pool.num_free == 7
    pool.free(held)
    pool.check_invariants()


def test_prefix_cap_evicts_least_recently_released_first() -> None:
    cache = cached_pool(10, 6)
    pool = cache.pool
    assert pool.set_zone_limits(None, 4) == 2
    assert [h(i) in cache for i in range(6)] == [False, False, True, True, True, True]
    # A release past the cap evicts the oldest again.
    [b] = pool.allocate(1)
    cache.insert([h(99)], [b])
    cache.release([b])
    assert pool.num_cached == 4 and h(2) not in cache and h(99) in cache
    cache.check_invariants()


def test_lifting_caps_restores_the_single_pool() -> None:
    cache = cached_pool(8, 4)
    cache.pool.set_zone_limits(2, 2)
    cache.pool.set_zone_limits(None, None)
    assert len(cache.pool.allocate(8)) == 8  # evicts the 2 cached left, no zone_limit


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["alloc", "release", "cap"]), st.integers(0, 8), st.integers(0, 8)),
                max_size=40))
def test_pool_caps_against_an_oracle(ops: list[tuple[str, int, int]]) -> None:
    """The oracle: refcount-1 holdings, an LRU list of cached blocks, and the two caps. It predicts
    refusals (zone_limit before anything else fits the same rule as BlockPool.allocate), which blocks
    a cap evicts, and the counts after each step."""
    n = 8
    cache = PrefixCache(BlockPool(n))
    pool = cache.pool
    held: list[BlockId] = []
    lru: list[BlockHash] = []  # oracle: cached hashes, least recently released first
    kv_cap: int | None = None
    prefix_cap: int | None = None
    serial = 0
    for op, a, c in ops:
        if op == "cap":
            kv_cap, prefix_cap = (a or None), (c if c < 8 else None)
            pool.set_zone_limits(kv_cap, prefix_cap)
        elif op == "alloc" and a:
            free = n - len(held) - len(lru)
            if a > free + len(lru):
                expect: str | None = "no_free_block"
            elif kv_cap is not None and len(held) + a > kv_cap:
                expect = "zone_limit"
            else:
                expect = None
            try:
                got = pool.allocate(a)
            except OutOfBlocks as e:
                assert e.reason == expect
            else:
                assert expect is None
                evicted = max(0, a - free)
                lru = lru[evicted:]
                held += got
        elif op == "release" and held:
            b = held.pop(a % len(held))
            serial += 1
            cache.insert([h(serial)], [b])
            cache.release([b])
            lru.append(h(serial))
        if prefix_cap is not None and len(lru) > prefix_cap:
            lru = lru[len(lru) - prefix_cap:]
        assert all(x in cache for x in lru) and len(cache) == len(lru)
        assert pool.num_in_use == len(held) and pool.num_cached == len(lru)
        cache.check_invariants()


# --- policies and the governor ----------------------------------------------------------------

def test_policies_set_the_pool_caps() -> None:
    for name, caps in (("shared", (None, None)), ("fixed", (6, 4)), ("borrow", (6, 4))):
        pool = BlockPool(10, block_bytes=0)
        gov = ZoneGovernor(pool, ZoneSetup(policy=name, kv_fraction=0.6), clock=lambda: 0.0)
        assert gov.policy is not None and type(gov.policy) is type(make_zone_policy(name))
        gov.rebalance()
        assert pool.zone_limits == caps


def test_borrow_governor_lends_prefix_blocks_to_running_kv() -> None:
    now = [0.0]
    pool = BlockPool(100)
    gov = ZoneGovernor(pool, ZoneSetup(policy="borrow", kv_fraction=0.5,
                                       watermarks=ZoneConfig(borrow_step=0.2, borrow_interval_s=1.0)),
                       clock=lambda: now[0])
    held = pool.allocate(45)  # kv 45 / 50 = 0.9: borrows 10 (0.2 of prefix's 50) from an empty prefix
    gov.after_step(1234)
    assert pool.zone_limits == (60, 40)
    assert gov.activation_peak == 1234 and gov.budget[ACT].used == 1234
    pool.free(held)
    now[0] = 2.0
    gov.rebalance()  # kv empty: everything returns
    assert pool.zone_limits == (50, 50)
    gov.budget.check_invariants()


def test_weights_bytes_grow_the_budget() -> None:
    gov = ZoneGovernor(BlockPool(10, block_bytes=100))
    gov.set_weights_bytes(5000)
    assert gov.budget.total == 6000 and gov.budget[WEIGHTS].watermark == 1.0
    gov.budget.check_invariants()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["alloc", "release", "tick"]), st.integers(1, 12)), max_size=50))
def test_borrow_governor_keeps_pool_and_budget_consistent(ops: list[tuple[str, int]]) -> None:
    """Random allocations, releases (cached under fresh hashes) and clock ticks under `borrow`: after
    every rebalance the pool's caps are the budget's kv allotment in whole blocks and the rest, the
    prefix cap holds, the caps follow the budget's moves exactly, and every invariant holds."""
    now = [0.0]
    bb = 10
    cache = PrefixCache(BlockPool(40, block_bytes=bb))
    pool = cache.pool
    gov = ZoneGovernor(pool, ZoneSetup(policy="borrow", kv_fraction=0.5,
                                       watermarks=ZoneConfig(borrow_step=0.25, borrow_interval_s=1.0)),
                       clock=lambda: now[0])
    held: list[BlockId] = []
    serial = 0
    for op, n in ops:
        if op == "alloc":
            try:
                held += pool.allocate(n)
            except OutOfBlocks as e:
                assert e.reason in ("zone_limit", "no_free_block")
        elif op == "release" and held:
            b = held.pop(n % len(held))
            serial += 1
            cache.insert([h(1000 + serial)], [b])
            cache.release([b])
        else:
            now[0] += n / 4
        gov.rebalance()
        kv_blocks = gov.budget.allotted(KV) // bb
        assert pool.zone_limits == (kv_blocks, 40 - kv_blocks)
        assert pool.num_cached <= 40 - kv_blocks
        gov.budget.check_invariants()
        cache.check_invariants()
        assert pool.num_in_use == len(held)
