"""GlobalIndex against a brute-force oracle: a set of (node, tier, hash) and a fixed forest of parents."""


import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from radixmesh.cluster.metadata.index import GlobalIndex, PrefixLengths
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.events import AllCleared, BlockRemoved, BlockStored, Tier
from radixmesh.proto.ids import NodeId
from tests.support.hashes import h as _h

LAYOUT = "layout-a"
NODES = [NodeId(f"n{i}") for i in range(4)]
TIERS = [Tier.GPU, Tier.HOST, Tier.DISK]


# A fixed forest of 24 blocks: 0 and 12 are roots, every other block hangs under an earlier one.
PARENT: dict[int, int | None] = {0: None, 12: None}
for _i in range(1, 24):
    if _i != 12:
        PARENT[_i] = (_i - 1) if _i % 3 else (_i // 3)
HASH = [_h(i) for i in range(24)]
UNKNOWN = _h(999)


def path_to(i: int) -> list[int]:
    """Block ids from the root down to block i."""
    out = []
    cur: int | None = i
    while cur is not None:
        out.append(cur)
        cur = PARENT[cur]
    return out[::-1]


def oracle_match(held: set[tuple[NodeId, Tier, BlockHash]], query: list[BlockHash]) -> tuple[int, dict]:
    def run(pred) -> int:  # type: ignore[no-untyped-def]
        n = 0
        while n < len(query) and pred(query[n]):
            n += 1
        return n

    cluster = run(lambda h: any((n, t, h) in held for n in NODES for t in TIERS))
    prefixes = {}
    for n in NODES:
        gpu = run(lambda h, n=n: (n, Tier.GPU, h) in held)
        host = run(lambda h, n=n: (n, Tier.GPU, h) in held or (n, Tier.HOST, h) in held)
        any_tier = run(lambda h, n=n: any((n, t, h) in held for t in TIERS))
        if any_tier:
            prefixes[n] = PrefixLengths(gpu, host, any_tier)
    return cluster, prefixes


class IndexMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.index = GlobalIndex()
        self.held: set[tuple[NodeId, Tier, BlockHash]] = set()
        self.added: set[NodeId] = set()

    def _ensure(self, node: NodeId) -> None:
        if node not in self.added:
            self.index.add_node(node, LAYOUT)
            self.added.add(node)

    @rule(node=st.sampled_from(NODES), tier=st.sampled_from(TIERS), end=st.integers(0, 23), k=st.integers(1, 5))
    def store(self, node: NodeId, tier: Tier, end: int, k: int) -> None:
        chain = path_to(end)[-k:]
        parent = PARENT[chain[0]]
        self._ensure(node)
        self.index.apply(node, [BlockStored(tuple(HASH[i] for i in chain), HASH[parent] if parent is not None else None, tier)])
        self.held |= {(node, tier, HASH[i]) for i in chain}

    @rule(node=st.sampled_from(NODES), tier=st.sampled_from(TIERS), ids=st.sets(st.integers(0, 23), max_size=6))
    def remove(self, node: NodeId, tier: Tier, ids: set[int]) -> None:
        self._ensure(node)
        self.index.apply(node, [BlockRemoved(tuple(HASH[i] for i in ids), tier)])
        self.held -= {(node, tier, HASH[i]) for i in ids}

    @rule(node=st.sampled_from(NODES))
    def clear(self, node: NodeId) -> None:
        self._ensure(node)
        self.index.apply(node, [AllCleared()])
        self.held = {x for x in self.held if x[0] != node}

    @rule(node=st.sampled_from(NODES))
    def drop(self, node: NodeId) -> None:
        self.index.drop_node(node)
        self.added.discard(node)
        self.held = {x for x in self.held if x[0] != node}

    @rule(node=st.sampled_from(NODES), end=st.integers(0, 23), wrong=st.integers(0, 23))
    def conflicting_parent_refused(self, node: NodeId, end: int, wrong: int) -> None:
        if PARENT[end] == wrong:
            return
        self._ensure(node)
        before = self._state()
        parent = HASH[PARENT[end]] if PARENT[end] is not None else None  # type: ignore[index]
        good = BlockStored((HASH[end],), parent, Tier.GPU)
        bad = BlockStored((HASH[end],), HASH[wrong], Tier.HOST)
        with pytest.raises(ValueError, match="parent"):
            self.index.apply(node, [good, bad])
        assert self._state() == before  # all or nothing: `good` was not applied either

    def _state(self) -> tuple[int, list[object]]:
        return len(self.index), [self.index.match(LAYOUT, [HASH[j] for j in path_to(i)]) for i in range(24)]

    @rule(end=st.integers(0, 23), extra=st.booleans(), skip_root=st.booleans())
    def match(self, end: int, extra: bool, skip_root: bool) -> None:
        ids = path_to(end)
        query = [HASH[i] for i in ids] + ([UNKNOWN, HASH[end]] if extra else [])
        if skip_root:
            query = query[1:]
        got = self.index.match(LAYOUT, query)
        cluster, prefixes = oracle_match(self.held, query)
        assert got.cluster_blocks == cluster
        assert got.prefixes == prefixes

    @invariant()
    def consistent(self) -> None:
        self.index.check_invariants()
        for n in self.added:
            assert self.index.node_block_count(n) == len({h for (m, _, h) in self.held if m == n})

    @rule()
    def chains_rebuild_the_node(self) -> None:
        for n in self.added:
            rebuilt = GlobalIndex()
            rebuilt.add_node(n, LAYOUT)
            rebuilt.replace(n, self.index.node_chains(n))
            rebuilt.check_invariants()
            for i in range(24):
                q = [HASH[j] for j in path_to(i)]
                assert rebuilt.match(LAYOUT, q).prefixes.get(n) == self.index.match(LAYOUT, q).prefixes.get(n)


TestIndexMachine = IndexMachine.TestCase
TestIndexMachine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


def test_match_counts_each_tier_and_either_tier() -> None:
    index = GlobalIndex()
    a = NodeId("a")
    index.add_node(a, LAYOUT)
    h = HASH[:4]
    index.insert(a, h[:3], None, Tier.GPU)
    index.remove(a, [h[1]], Tier.GPU)
    index.insert(a, [h[1]], h[0], Tier.HOST)
    got = index.match(LAYOUT, h)
    # blocks: 0 gpu, 1 host, 2 gpu, 3 nowhere
    assert got == (3, {a: PrefixLengths(gpu=1, host=3, any_tier=3)})
    index.insert(a, [h[3]], h[2], Tier.DISK)
    assert index.match(LAYOUT, h) == (4, {a: PrefixLengths(gpu=1, host=3, any_tier=4)})


def test_layouts_are_partitions() -> None:
    index = GlobalIndex()
    index.add_node(NodeId("a"), "L1")
    index.add_node(NodeId("b"), "L2")
    index.insert(NodeId("a"), HASH[:2], None, Tier.GPU)
    assert index.match("L2", HASH[:2]) == (0, {})
    assert index.match("nope", HASH[:2]) == (0, {})
    with pytest.raises(ValueError, match="layout"):
        index.add_node(NodeId("a"), "L2")
    with pytest.raises(ValueError, match="not in the index"):
        index.insert(NodeId("c"), HASH[:1], None, Tier.GPU)


def test_drop_node_touches_only_its_blocks() -> None:
    index = GlobalIndex()
    for n in ("a", "b"):
        index.add_node(NodeId(n), LAYOUT)
    index.insert(NodeId("a"), HASH[:3], None, Tier.GPU)
    index.insert(NodeId("b"), HASH[:2], None, Tier.HOST)
    index.drop_node(NodeId("a"))
    index.check_invariants()
    assert len(index) == 2
    assert index.match(LAYOUT, HASH[:3]) == (2, {NodeId("b"): PrefixLengths(0, 2, 2)})


def test_dropped_nodes_slot_is_reused_without_its_blocks() -> None:
    index = GlobalIndex()
    a, b, c = NodeId("a"), NodeId("b"), NodeId("c")
    for n in (a, b):
        index.add_node(n, LAYOUT)
    index.insert(a, HASH[:3], None, Tier.GPU)
    index.insert(b, HASH[:1], None, Tier.HOST)
    index.drop_node(a)
    index.add_node(c, LAYOUT)  # takes a's freed slot
    index.check_invariants()
    assert index.node_block_count(c) == 0
    assert index.match(LAYOUT, HASH[:3]) == (1, {b: PrefixLengths(0, 1, 1)})
    index.insert(c, HASH[:2], None, Tier.GPU)
    assert index.match(LAYOUT, HASH[:3]) == (2, {b: PrefixLengths(0, 1, 1), c: PrefixLengths(2, 2, 2)})


def test_many_nodes_each_get_their_own_prefix() -> None:
    # 70 nodes: holder masks are 210-bit integers, wider than any machine word.
    index = GlobalIndex()
    chain = [_h(1000 + i) for i in range(12)]
    nodes = [NodeId(f"w{i}") for i in range(70)]
    for i, n in enumerate(nodes):
        index.add_node(n, LAYOUT)
        index.insert(n, chain[: i % 12 + 1], None, Tier.GPU if i % 2 else Tier.HOST)
    for n in nodes[::3]:
        index.drop_node(n)
    index.check_invariants()
    want = {}
    for i, n in enumerate(nodes):
        if i % 3:
            k = i % 12 + 1
            want[n] = PrefixLengths(k if i % 2 else 0, k, k)
    assert index.match(LAYOUT, chain) == (12, want)


def test_a_batch_may_store_one_chain_on_both_tiers_but_not_under_two_parents() -> None:
    index = GlobalIndex()
    a = NodeId("a")
    index.add_node(a, LAYOUT)
    index.apply(a, [BlockStored(tuple(HASH[:3]), None, Tier.GPU), BlockStored(tuple(HASH[:3]), None, Tier.HOST)])
    assert index.match(LAYOUT, HASH[:3]) == (3, {a: PrefixLengths(3, 3, 3)})
    with pytest.raises(ValueError, match="parent"):
        index.apply(a, [BlockStored((HASH[5], HASH[6], HASH[5]), None, Tier.GPU)])
    with pytest.raises(ValueError, match="own parent"):
        index.apply(a, [BlockStored((HASH[7],), HASH[7], Tier.GPU)])
    index.check_invariants()
    assert len(index) == 3
