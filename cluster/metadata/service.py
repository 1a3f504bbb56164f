"""MetadataService: the plain object behind the gRPC metadata server.

It owns the GlobalIndex, Membership and HitAccounting, and writes what must survive a restart to a
StateStore (node records, counters, and on `persist` the index of the nodes whose blocks changed).
A node holds at most its declared capacity plus slack in the index (LimitExceeded past it). Every
method validates its whole input before changing anything; leases are checked lazily against the
injected clock. Not thread-safe: one event loop owns the service. What persists when, and why:
docs/routing.md#the-services-state.
"""

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from functools import partial

from radixmesh.cluster.metadata.feed import IndexFeed, Subscription
from radixmesh.cluster.metadata.hit_accounting import HitAccounting, Prediction
from radixmesh.cluster.metadata.index import GlobalIndex
from radixmesh.cluster.metadata.membership import Member, Membership, SeqVerdict
from radixmesh.cluster.metadata.service_config import LimitExceeded, ServiceConfig, check_hashes, check_limit
from radixmesh.cluster.metadata.store import IndexPart, MemoryStore, StateStore
from radixmesh.proto.events import AllCleared, BlockRemoved, BlockStored, CacheEvent
from radixmesh.proto.ids import NodeId
from radixmesh.proto.metadata.codec import decode_stored_index, encode_stored_index
from radixmesh.proto.metadata.hits import RequestHits
from radixmesh.proto.metadata.limits import (
    MAX_REQUEST_ID_CHARS,
    check_text,
)
from radixmesh.proto.metadata.messages import (
    ClusterStats,
    EventBatch,
    IndexUpdate,
    MatchPrediction,
    MatchQuery,
    MatchResult,
    NodeBlocks,
    NodeMatch,
    NodeSnapshot,
    PublishAck,
    PublishStatus,
    RoutedWork,
    WatchedNode,
)
from radixmesh.proto.metadata.nodes import Lease, NodeInfo, NodeLoad

logger = logging.getLogger(__name__)

class MetadataService:
    """Global index, membership and hit accounting behind one validated API."""

    def __init__(
        self,
        store: StateStore | None = None,
        config: ServiceConfig | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`clock` must be wall time (or a test clock) because lease deadlines are persisted."""
        self.config = config or ServiceConfig()
        self.store = store or MemoryStore()
        self.index = GlobalIndex(self.config.recall_blocks)
        self.membership = Membership(self.config.lease_ttl_s, clock)
        self._clock = clock
        self.hits = HitAccounting(self.config.max_predictions)
        self.feed = IndexFeed(self.config.watch_backlog)
        """Every change below is recorded here, in order, for the routers' index replicas."""
        self.over_capacity_refusals = 0
        """Batches and snapshots refused because the node would hold more than its capacity allows."""
        self._unpersisted: set[NodeId] = set()
        """Nodes whose index part changed (or that left) since the last persist."""
        self._replace_stored_index = True
        """The first persist replaces the store's whole index: parts of nodes that left meanwhile, or
        that a previous active service wrote late, go with it."""
        self._restore()

    def register(self, info: NodeInfo) -> Lease:
        """Grant a lease; a new incarnation (or one whose lease ended) starts with no blocks.

        ValueError when another live node of the same layout declared other block_bytes: the layout
        fingerprint covers the dtype and shape, so equal layouts have equal blocks.
        """
        latest = int((self._clock() + self.config.limits.max_epoch_ahead_s) * 1e6)
        if info.epoch > latest:
            raise ValueError(f"epoch {info.epoch} is ahead of the service's clock (at most {latest}: "
                             "epochs are microseconds of wall time)")
        self._expire()
        for peer in (m.info for m in self.membership.members() if m.info.node_id != info.node_id):
            if peer.layout == info.layout and peer.block_bytes != info.block_bytes:
                raise ValueError(f"layout {info.layout}: block_bytes {info.block_bytes} differs from "
                                 f"{peer.block_bytes} of node {peer.node_id}")
        member, fresh = self.membership.register(info)
        if fresh:
            self.index.drop_node(info.node_id)
            self.index.add_node(info.node_id, info.layout)
            self._changed(info.node_id)
            self.feed.record(left=(info.node_id,), nodes=(_watched(member),))
            logger.info("node %s registered, epoch %d, layout %s", info.node_id, info.epoch, info.layout)
        self.store.save_node(info.node_id, self.membership.encode(info.node_id))
        return self.membership.lease(member, snapshot_required=fresh)

    def heartbeat(self, node: NodeId, epoch: int, load: NodeLoad, hits: Sequence[RequestHits] = ()) -> Lease:
        """Renew the lease, record load and realized hits (counted once per call)."""
        check_limit("hits per heartbeat", len(hits), self.config.limits.max_hits_per_heartbeat)
        self._expire()
        known = self.membership.get(node)
        before = known.load if known is not None else None
        member = self.membership.heartbeat(node, epoch, load)
        if load != before:
            self.feed.record(nodes=(_watched(member),))
        deltas: dict[str, dict[str, int]] = {}
        for h in hits:
            for scope, delta in self.hits.record(node, h).items():
                mine = deltas.setdefault(scope, {})
                for name, value in delta.items():
                    mine[name] = mine.get(name, 0) + value
        if deltas:
            self.store.add_counters(deltas)
        self.store.save_node(node, self.membership.encode(node))
        recalled, member.recall_cursor = self.index.lost_since(
            member.info.layout, member.recall_cursor, self.config.max_recalled_per_lease)
        return self.membership.lease(member, snapshot_required=False, recalled=tuple(recalled))

    def publish(self, batch: EventBatch) -> PublishAck:
        """Apply one batch in sequence order; duplicates are acknowledged, a gap asks for RESYNC."""
        blocks = sum(len(e.hashes) for e in batch.events if not isinstance(e, AllCleared))
        check_limit("blocks per batch", blocks, self.config.limits.max_blocks_per_batch)
        if batch.seq < 1:
            raise ValueError(f"seq counts from 1, got {batch.seq}")
        for e in batch.events:
            if isinstance(e, BlockStored | BlockRemoved):
                check_hashes(e.hashes)
            if isinstance(e, BlockStored) and e.parent is not None:
                check_hashes((e.parent,))
        self._expire()
        member = self.membership.current(batch.node_id, batch.epoch)
        verdict = self.membership.verdict(member, batch.seq)
        if verdict is SeqVerdict.GAP:
            logger.info("node %s: batch %d after %d, asking for resync", batch.node_id, batch.seq, member.last_seq)
            return PublishAck(PublishStatus.RESYNC, member.last_seq + 1)
        if verdict is SeqVerdict.APPLY:
            self._check_capacity(member, batch.events)
            self.index.apply(batch.node_id, batch.events)
            member.last_seq = batch.seq
            self._changed(batch.node_id)
            self.feed.record(blocks=(NodeBlocks(batch.node_id, batch.events),))
        return PublishAck(PublishStatus.OK, member.last_seq + 1)

    def sync_snapshot(self, snapshot: NodeSnapshot) -> PublishAck:
        """Replace the node's block set; a snapshot older than the applied events is ignored."""
        blocks = sum(len(c.hashes) for c in snapshot.chains)
        check_limit("blocks per snapshot", blocks, self.config.limits.max_snapshot_blocks)
        for c in snapshot.chains:
            check_hashes(c.hashes if c.parent is None else (*c.hashes, c.parent))
        self._expire()
        member = self.membership.current(snapshot.node_id, snapshot.epoch)
        if snapshot.seq >= member.last_seq:
            if blocks > self._block_cap(member):
                self._check_held(member, len({h for c in snapshot.chains for h in c.hashes}))
            self.index.replace(snapshot.node_id, snapshot.chains)
            member.last_seq = snapshot.seq
            self._changed(snapshot.node_id)
            self.feed.record(blocks=(NodeBlocks(snapshot.node_id, snapshot.chains, replace=True),))
        return PublishAck(PublishStatus.OK, member.last_seq + 1)

    def match(self, queries: Sequence[MatchQuery]) -> list[MatchResult]:
        """Answer each query; remember predictions of queries that carry a request id."""
        limits = self.config.limits
        check_limit("queries per request", len(queries), limits.max_queries_per_request)
        for q in queries:
            check_limit("hashes per query", len(q.hashes), limits.max_hashes_per_query)
            if not q.layout:
                raise ValueError("layout fingerprint must be non-empty")
            check_hashes(q.hashes)
        self._expire()
        return [self._match_one(q) for q in queries]

    def record_predictions(self, predictions: Sequence[MatchPrediction], router_id: str = "") -> None:
        """Remember predictions a router made on its own replica, as `match` does for a request id, and
        pass where it routed them on to every watcher (the other routers' load tables)."""
        check_limit("predictions per report", len(predictions), self.config.limits.max_predictions_per_report)
        check_text("router id", router_id, MAX_REQUEST_ID_CHARS)
        for p in predictions:
            # Hit accounting reads the serving node's entry only: a routed prediction keeps just its
            # node's (reports name every live node, 64 of them x 8192 predictions was 110 MiB).
            local = ({p.routed_node: p.local_tokens.get(p.routed_node, 0)} if p.routed_node
                     else dict(p.local_tokens))
            self.hits.predict(p.request_id, Prediction(p.cluster_tokens, local))
        work = tuple(RoutedWork(router_id, p.routed_node, p.routed_tokens) for p in predictions if p.routed_node)
        if work:
            self.feed.record(work=work)

    def watch(self) -> tuple[Subscription, IndexUpdate]:
        """A new watcher's subscription and its first message, a snapshot: every change recorded
        after it is queued on the subscription (taken in one step, so none is missed or doubled)."""
        self._expire()
        return self.feed.subscribe(), self.snapshot_update()

    def resnapshot(self, sub: Subscription) -> IndexUpdate:
        """A fresh snapshot for a watcher that fell behind; its queue restarts after it."""
        self._expire()
        sub.restart()
        return self.snapshot_update()

    def snapshot_update(self) -> IndexUpdate:
        """The whole state a watcher replicates, as one reset update at the feed's current seq."""
        members = self.membership.members()
        return IndexUpdate(
            self.feed.seq,
            reset=True,
            nodes=tuple(_watched(m) for m in members),
            blocks=tuple(
                NodeBlocks(m.info.node_id, tuple(self.index.node_chains(m.info.node_id)), replace=True)
                for m in members
            ),
            incarnation=self.feed.incarnation,
        )

    def stats(self) -> ClusterStats:
        self._expire()
        live = len(self.membership.members())
        return ClusterStats(self.hits.stats(), live, len(self.index), self.store.describe())

    def tick(self) -> None:
        """Periodic upkeep: end expired leases and persist the index."""
        self._expire()
        self.persist()

    def persist(self) -> None:
        """Record in the state store the index part (blocks and applied sequence number) of every node
        changed since the last persist; the store encodes and writes them off the event loop. On the
        loop this copies the changed nodes' blocks (GlobalIndex.frozen_chains), nothing more; with a
        store that does not keep the index, it does nothing."""
        if not self.store.keeps_index:
            return
        replace = self._replace_stored_index
        changed = [m.info.node_id for m in self.membership.members()] if replace else self._unpersisted
        members = [m for m in map(self.membership.get, changed) if m is not None]
        chains = self.index.frozen_chains(m.info.node_id for m in members)
        parts: dict[str, IndexPart | None] = dict.fromkeys(changed)  # None: the node left
        for m in members:
            node = m.info.node_id
            parts[node] = partial(_encode_part, node, m.info.epoch, m.last_seq, chains[node])
        self.store.update_index(parts, replace)
        self._unpersisted, self._replace_stored_index = set(), False

    def close(self) -> None:
        """Persist and release the store; the object is unusable afterwards."""
        self.persist()
        self.store.close()

    def check_invariants(self) -> None:
        self.index.check_invariants()
        self.membership.check_invariants()
        live = {m.info.node_id for m in self.membership.members()}
        assert set(self.index.nodes()) == live, f"index nodes {self.index.nodes()} != live {sorted(live)}"

    def _match_one(self, q: MatchQuery) -> MatchResult:
        found = self.index.match(q.layout, q.hashes)
        nodes = []
        for node, pl in found.prefixes.items():
            m = self._member(node)
            nodes.append(NodeMatch(node, m.info.transfer_address, pl.gpu, pl.host, pl.any_tier, m.load))
        if q.include_all_nodes:
            nodes.extend(
                NodeMatch(m.info.node_id, m.info.transfer_address, 0, 0, 0, m.load)
                for m in self.membership.members()
                if m.info.layout == q.layout and m.info.node_id not in found.prefixes
            )
        nodes.sort(key=lambda n: n.any_tier_blocks, reverse=True)
        if q.request_id is not None:
            self.hits.predict(q.request_id, self._prediction(found.cluster_blocks, nodes))
        return MatchResult(found.cluster_blocks, tuple(nodes))

    def _prediction(self, cluster_blocks: int, nodes: Iterable[NodeMatch]) -> Prediction:
        local = {}
        block_size = 0
        for n in nodes:
            block_size = self._member(n.node_id).info.block_size  # equal for one layout
            local[n.node_id] = n.any_tier_blocks * block_size
        return Prediction(cluster_blocks * block_size, local)

    def _block_cap(self, member: Member) -> int:
        """The most blocks `member` may hold in the index."""
        limits = self.config.limits
        declared = member.info.capacity_blocks or limits.max_snapshot_blocks
        return min(declared, limits.max_snapshot_blocks) + limits.capacity_slack_blocks

    def _check_capacity(self, member: Member, events: Sequence[CacheEvent]) -> None:
        node = member.info.node_id
        held = self.index.node_block_count(node)
        stored = sum(len(e.hashes) for e in events if isinstance(e, BlockStored))
        if held + stored > self._block_cap(member):  # else no order of these events can pass the cap
            self._check_held(member, self.index.held_after(node, events), held)

    def _check_held(self, member: Member, after: int, before: int = 0) -> None:
        """LimitExceeded (counted) when `member` would hold `after` blocks, above its cap and more than
        the `before` it holds now (a node above its cap, e.g. restored so, may still shrink)."""
        cap = self._block_cap(member)
        if after > cap and after > before:
            self.over_capacity_refusals += 1
            info = member.info
            logger.warning("node %s: refused to index %d blocks (declared capacity %d)", info.node_id,
                           after, info.capacity_blocks)
            raise LimitExceeded(f"node {info.node_id} would hold {after} blocks, more than its declared "
                                f"capacity_blocks {info.capacity_blocks} allows ({cap} with the slack)")

    def _changed(self, node: NodeId) -> None:
        """`node`'s index part is to be written by the next persist."""
        if self.store.keeps_index:
            self._unpersisted.add(node)

    def _member(self, node: NodeId) -> Member:
        m = self.membership.get(node)
        assert m is not None, f"index holds node {node} without a live lease"
        return m

    def _expire(self) -> None:
        gone = self.membership.expire()
        for node in gone:
            self.index.drop_node(node)
            self.store.save_node(node, self.membership.encode(node))
            self._changed(node)
        if gone:
            self.feed.record(left=tuple(gone))

    def _restore(self) -> None:
        for node, record in self.store.load_nodes().items():
            self.membership.restore(NodeId(node), record)
        for m in self.membership.members():
            self.index.add_node(m.info.node_id, m.info.layout)
        blob = self.store.load_index()
        for snap in decode_stored_index(blob) if blob else ():
            member = self.membership.get(snap.node_id)
            if member is not None and member.info.epoch == snap.epoch:
                self.index.replace(snap.node_id, snap.chains)
                member.last_seq = snap.seq
        self.hits.add(self.store.load_counters())
        logger.info(
            "state from %s: %d live nodes, %d indexed blocks",
            self.store.describe(),
            len(self.membership.members()),
            len(self.index),
        )


def _encode_part(node: NodeId, epoch: int, seq: int, chains: Callable[[], list[BlockStored]]) -> bytes:
    """One node's part of the stored index (runs on the store's writer thread)."""
    return encode_stored_index([NodeSnapshot(node, epoch, seq, tuple(chains()))])


def _watched(m: Member) -> WatchedNode:
    i = m.info
    return WatchedNode(i.node_id, i.layout, i.transfer_address, i.block_size, m.load)
