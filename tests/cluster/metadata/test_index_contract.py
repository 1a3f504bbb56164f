"""The index contract, one suite run against every place that answers Match: the metadata GlobalIndex
itself, the metadata service around it (leases, sequence numbers), and the router's IndexReplica fed
by the service's watch feed. Each gets the same nodes' cache events and must answer as a brute-force
oracle (a set of (node, tier, hash)) does; a batch that contradicts a node's parent links is refused
whole by each."""

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixmesh.cluster.metadata.index import GlobalIndex, PrefixLengths
from radixmesh.cluster.metadata.replica import IndexReplica
from radixmesh.cluster.metadata.service import MetadataService
from radixmesh.cluster.metadata.service_config import ServiceConfig
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.events import AllCleared, BlockRemoved, BlockStored, CacheEvent, Tier
from radixmesh.proto.ids import NodeId
from radixmesh.proto.metadata.messages import EventBatch, MatchQuery
from radixmesh.proto.metadata.nodes import NodeInfo, NodeLoad
from tests.support.hashes import h

L = "layout-contract"
NODES = [NodeId(f"n{i}") for i in range(3)]
TIERS = [Tier.GPU, Tier.HOST, Tier.DISK]
TTL = 10.0
# A fixed forest of 12 blocks: 0 and 6 are roots, every other block hangs under an earlier one.
PARENT: dict[int, int | None] = {i: None if i in (0, 6) else (i - 1 if i % 3 else i // 3) for i in range(12)}
Answer = tuple[int, dict[NodeId, PrefixLengths]]


def path_to(i: int) -> list[int]:
    """Block ids from the root down to block i."""
    out: list[int] = []
    cur: int | None = i
    while cur is not None:
        out.append(cur)
        cur = PARENT[cur]
    return out[::-1]


class Index(ABC):
    """One implementation, driven by node events and asked Match."""

    @abstractmethod
    def join(self, node: NodeId) -> None:
        """`node` enters (again) holding nothing."""

    @abstractmethod
    def events(self, node: NodeId, events: Sequence[CacheEvent]) -> None:
        """One batch of `node`'s events, all or nothing (ValueError)."""

    @abstractmethod
    def leave(self, node: NodeId) -> None:
        """`node` is gone with its blocks."""

    @abstractmethod
    def match(self, query: Sequence[BlockHash]) -> Answer:
        """Cluster prefix, and each node holding block 0 with its prefix by tier."""


class DirectIndex(Index):
    def __init__(self) -> None:
        self.index = GlobalIndex()

    def join(self, node: NodeId) -> None:
        self.index.drop_node(node)
        self.index.add_node(node, L)

    def events(self, node: NodeId, events: Sequence[CacheEvent]) -> None:
        self.index.apply(node, events)
        self.index.check_invariants()

    def leave(self, node: NodeId) -> None:
        self.index.drop_node(node)

    def match(self, query: Sequence[BlockHash]) -> Answer:
        found = self.index.match(L, query)
        return found.cluster_blocks, found.prefixes


class ServiceIndex(Index):
    """The service: a node joins with a newer epoch, publishes numbered batches, leaves when its lease
    ends (the others heartbeat meanwhile)."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.service = MetadataService(config=ServiceConfig(lease_ttl_s=TTL), clock=lambda: self.now)
        self.epochs: dict[NodeId, int] = {}
        self.next_seq: dict[NodeId, int] = {}

    def join(self, node: NodeId) -> None:
        self.epochs[node] = self.epochs.get(node, 0) + 1
        lease = self.service.register(NodeInfo(node, self.epochs[node], L, 16, 4096, f"ucx://{node}", 1000))
        self.next_seq[node] = lease.next_seq

    def events(self, node: NodeId, events: Sequence[CacheEvent]) -> None:
        self.service.publish(EventBatch(node, self.epochs[node], self.next_seq[node], tuple(events)))
        self.next_seq[node] += 1
        self.service.check_invariants()

    def leave(self, node: NodeId) -> None:
        others = [n for n in self.next_seq if n != node and self.service.membership.get(n) is not None]
        for step in (0.0, TTL / 2):  # the others renew now and half a lease later; `node` does not
            self.now += step
            for other in others:
                self.service.heartbeat(other, self.epochs[other], NodeLoad())
        self.now += TTL / 2 + 1.0
        self.service.tick()
        assert self.service.membership.get(node) is None

    def match(self, query: Sequence[BlockHash]) -> Answer:
        [result] = self.service.match([MatchQuery(L, tuple(query))])
        held = {n.node_id: PrefixLengths(n.gpu_blocks, n.host_blocks, n.any_tier_blocks)
                for n in result.nodes if n.any_tier_blocks}
        return result.cluster_blocks, held


class ReplicaIndex(ServiceIndex):
    """The router's replica: every change reaches it through the service's watch feed."""

    def __init__(self) -> None:
        super().__init__()
        self.sub, first = self.service.watch()
        self.replica = IndexReplica()
        self.replica.apply(first)

    def _follow(self, change: Callable[[], None]) -> None:
        try:
            change()
        finally:
            for update in self.sub.take() or [self.service.resnapshot(self.sub)]:
                self.replica.apply(update)
            self.replica.check_invariants()

    def join(self, node: NodeId) -> None:
        self._follow(lambda: super(ReplicaIndex, self).join(node))

    def events(self, node: NodeId, events: Sequence[CacheEvent]) -> None:
        self._follow(lambda: super(ReplicaIndex, self).events(node, events))

    def leave(self, node: NodeId) -> None:
        self._follow(lambda: super(ReplicaIndex, self).leave(node))

    def match(self, query: Sequence[BlockHash]) -> Answer:
        result = self.replica.match(L, query)
        return result.cluster_blocks, {n.node_id: PrefixLengths(n.gpu_blocks, n.host_blocks, n.any_tier_blocks)
                                       for n in result.nodes}


IMPLEMENTATIONS: dict[str, Callable[[], Index]] = {
    "global_index": DirectIndex, "service": ServiceIndex, "router_replica": ReplicaIndex}
EACH = pytest.mark.parametrize("name", list(IMPLEMENTATIONS))
"""A parametrize, not a fixture: hypothesis reruns one test body per example, each on a new index."""


class Oracle:
    def __init__(self) -> None:
        self.held: set[tuple[NodeId, Tier, BlockHash]] = set()

    def match(self, query: Sequence[BlockHash]) -> Answer:
        def run(held: Callable[[BlockHash], bool]) -> int:
            n = 0
            while n < len(query) and held(query[n]):
                n += 1
            return n

        def on(nodes: Sequence[NodeId], tiers: Sequence[Tier]) -> Callable[[BlockHash], bool]:
            return lambda x: any((n, t, x) in self.held for n in nodes for t in tiers)

        prefixes = {}
        for n in NODES:
            lengths = PrefixLengths(run(on([n], TIERS[:1])), run(on([n], TIERS[:2])), run(on([n], TIERS)))
            if lengths.any_tier:
                prefixes[n] = lengths
        return run(on(NODES, TIERS)), prefixes

    def forget(self, node: NodeId) -> None:
        self.held = {x for x in self.held if x[0] != node}


def stored(end: int, k: int, tier: Tier) -> tuple[BlockStored, list[int]]:
    chain = path_to(end)[-k:]
    parent = PARENT[chain[0]]
    return BlockStored(tuple(h(i) for i in chain), None if parent is None else h(parent), tier), chain


QUERIES = [[h(j) for j in path_to(i)] for i in range(12)] + [[h(1), h(2)], [h(0), h(99), h(1)], []]


@EACH
@settings(max_examples=40, deadline=None)
@given(st.data())
def test_match_answers_as_the_oracle_after_any_events(name: str, data: st.DataObject) -> None:
    index, oracle = IMPLEMENTATIONS[name](), Oracle()
    joined: list[NodeId] = []
    for _ in range(data.draw(st.integers(1, 25))):
        op = data.draw(st.sampled_from(["join", "store", "remove", "clear", "leave", "refused"]))
        if op == "join" or not joined:
            node = data.draw(st.sampled_from(NODES))
            index.join(node)
            oracle.forget(node)
            joined = sorted(set(joined) | {node})
            continue
        node, tier = data.draw(st.sampled_from(joined)), data.draw(st.sampled_from(TIERS))
        if op == "store":
            event, chain = stored(data.draw(st.integers(0, 11)), data.draw(st.integers(1, 4)), tier)
            index.events(node, [event])
            oracle.held |= {(node, tier, h(i)) for i in chain}
        elif op == "remove":
            ids = data.draw(st.sets(st.integers(0, 11), max_size=5))
            index.events(node, [BlockRemoved(tuple(h(i) for i in ids), tier)])
            oracle.held -= {(node, tier, h(i)) for i in ids}
        elif op == "clear":
            index.events(node, [AllCleared()])
            oracle.forget(node)
        elif op == "leave":
            index.leave(node)
            oracle.forget(node)
            joined.remove(node)
        else:
            end, wrong = data.draw(st.integers(1, 11)), data.draw(st.integers(0, 11))
            if PARENT[end] in (wrong, None) or wrong == end:
                continue
            good, _ = stored(end, 1, Tier.GPU)
            with pytest.raises(ValueError, match="parent"):
                index.events(node, [good, BlockStored((h(end),), h(wrong), Tier.HOST)])
        for query in QUERIES:
            assert index.match(query) == oracle.match(query), (op, query)


@EACH
def test_each_node_gets_its_prefix_by_tier(name: str) -> None:
    index = IMPLEMENTATIONS[name]()
    a, b = NODES[0], NODES[1]
    index.join(a)
    index.join(b)
    index.events(a, [stored(2, 3, Tier.GPU)[0], stored(4, 2, Tier.HOST)[0]])  # 0-1-2 on gpu, 3-4 on host
    index.events(b, [stored(1, 2, Tier.DISK)[0]])
    query = [h(j) for j in path_to(4)]  # 0 1 3 4
    assert index.match(query) == (4, {a: PrefixLengths(2, 4, 4), b: PrefixLengths(0, 0, 2)})
    index.leave(a)
    assert index.match(query) == (2, {b: PrefixLengths(0, 0, 2)})
