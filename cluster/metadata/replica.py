"""IndexReplica: a copy of the service's index and live nodes, kept by applying WatchIndex updates.

A router holds one so a routing decision reads a local GlobalIndex instead of making a Match RPC.
It answers `match` as MetadataService.match does (the property test compares them), except that it
only lists holders: the router picks its other candidates itself (cluster/policy/step.py, `narrow`),
which keeps a decision's cost independent of the node count.

Ordering: updates must arrive with seq = last + 1 from one feed incarnation; anything else (a lost
update, a restarted service) raises ReplicaGap and leaves the replica out of sync (`in_sync` False,
nothing answered) until the next reset snapshot. Not thread-safe: one event loop owns it.
"""

from collections.abc import Sequence

from radixmesh.cluster.metadata.index import GlobalIndex
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.events import BlockStored
from radixmesh.proto.ids import NodeId
from radixmesh.proto.metadata.messages import (
    IndexUpdate,
    MatchPrediction,
    MatchResult,
    NodeMatch,
    WatchedNode,
)


class ReplicaGap(Exception):
    """An update did not follow the last one applied: watch again for a fresh snapshot."""


class IndexReplica:
    """The service's index and live nodes as of update `seq`."""

    def __init__(self) -> None:
        self.index = GlobalIndex()
        self._nodes: dict[NodeId, WatchedNode] = {}
        self.seq: int | None = None
        """Last update applied; None while out of sync."""
        self.incarnation = ""

    @property
    def in_sync(self) -> bool:
        return self.seq is not None

    def desync(self) -> None:
        """Forget everything: nothing is answered until the next reset snapshot."""
        self.seq = None
        self.index = GlobalIndex()
        self._nodes = {}

    def apply(self, update: IndexUpdate) -> None:
        """Apply one update; ReplicaGap (replica now out of sync) when it does not follow the last."""
        if update.reset:
            self.desync()
        elif self.seq is None or update.seq != self.seq + 1 or update.incarnation != self.incarnation:
            expected = None if self.seq is None else self.seq + 1
            self.desync()
            raise ReplicaGap(f"update {update.seq} of {update.incarnation[:8]}: expected {expected}")
        index = self.index
        try:
            for node in update.left:
                index.drop_node(node)
                self._nodes.pop(node, None)
            for w in update.nodes:
                index.add_node(w.node_id, w.layout)
                self._nodes[w.node_id] = w
            for b in update.blocks:
                if b.replace:
                    index.replace(b.node_id, [e for e in b.events if isinstance(e, BlockStored)])
                else:
                    index.apply(b.node_id, b.events)
        except ValueError as e:  # the service applied it, so the replica has diverged: start over
            self.desync()
            raise ReplicaGap(f"update {update.seq} does not apply: {e}") from e
        self.seq = update.seq
        self.incarnation = update.incarnation

    def is_live(self, node: NodeId) -> bool:
        return node in self._nodes

    def node(self, node: NodeId) -> WatchedNode | None:
        return self._nodes.get(node)

    def nodes(self) -> list[WatchedNode]:
        return list(self._nodes.values())

    def match(self, layout: str, hashes: Sequence[BlockHash]) -> MatchResult:
        """Every live node holding block 0 of `hashes`, as Match answers it (longest first)."""
        found = self.index.match(layout, hashes)
        nodes = []
        for node, pl in found.prefixes.items():
            w = self._nodes[node]
            nodes.append(NodeMatch(node, w.transfer_address, pl.gpu, pl.host, pl.any_tier, w.load))
        nodes.sort(key=lambda n: n.any_tier_blocks, reverse=True)
        return MatchResult(found.cluster_blocks, tuple(nodes))

    def prediction(
        self, request_id: str, result: MatchResult, routed_node: NodeId | None = None, routed_tokens: int = 0
    ) -> MatchPrediction:
        """What Match with `request_id` would have remembered for hit accounting, and where the request
        went (shared with the other routers)."""
        block_size = self._nodes[result.nodes[0].node_id].block_size if result.nodes else 0
        local = {n.node_id: n.any_tier_blocks * block_size for n in result.nodes}
        return MatchPrediction(request_id, result.cluster_blocks * block_size, local, routed_node, routed_tokens)

    def check_invariants(self) -> None:
        self.index.check_invariants()
        assert set(self.index.nodes()) == set(self._nodes), "index nodes differ from the live nodes"
