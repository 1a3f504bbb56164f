"""The messages of the metadata service as typed dataclasses: what MetadataService takes and returns.

proto/metadata/codec.py converts them to and from the protobuf messages of proto/radixmesh.proto; nothing
else touches protobuf objects.
"""

from dataclasses import dataclass
from enum import Enum

from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.events import BlockStored, CacheEvent
from radixmesh.proto.ids import NodeId
from radixmesh.proto.metadata.hits import HitStats
from radixmesh.proto.metadata.limits import (
    MAX_LAYOUT_CHARS,
    MAX_REQUEST_ID_CHARS,
    MAX_TENANT_CHARS,
    check_text,
)
from radixmesh.proto.metadata.nodes import NodeLoad


@dataclass(frozen=True, slots=True)
class EventBatch:
    """One node's events, applied atomically; `seq` counts batches from 1 per epoch."""

    node_id: NodeId
    epoch: int
    seq: int
    events: tuple[CacheEvent, ...]


@dataclass(frozen=True, slots=True)
class NodeSnapshot:
    """A node's whole block set; it reflects the node's events up to and including `seq`."""

    node_id: NodeId
    epoch: int
    seq: int
    chains: tuple[BlockStored, ...]


class PublishStatus(Enum):
    OK = "ok"
    RESYNC = "resync"
    """A sequence gap: the node must send a NodeSnapshot."""


@dataclass(frozen=True, slots=True)
class PublishAck:
    status: PublishStatus
    next_seq: int


@dataclass(frozen=True, slots=True)
class MatchQuery:
    layout: str
    hashes: tuple[BlockHash, ...]
    tenant: str = ""
    request_id: str | None = None
    """Set to remember this prediction for hit accounting."""
    include_all_nodes: bool = False
    """Also list live nodes of the layout that hold no prefix (with their load)."""

    def __post_init__(self) -> None:
        check_text("layout fingerprint", self.layout, MAX_LAYOUT_CHARS)
        check_text("tenant", self.tenant, MAX_TENANT_CHARS)
        check_text("request id", self.request_id or "", MAX_REQUEST_ID_CHARS)


@dataclass(frozen=True, slots=True)
class NodeMatch:
    node_id: NodeId
    transfer_address: str
    gpu_blocks: int
    host_blocks: int
    any_tier_blocks: int
    load: NodeLoad


@dataclass(frozen=True, slots=True)
class MatchResult:
    cluster_blocks: int
    """Blocks 0..n-1 of the query each held by some live node."""
    nodes: tuple[NodeMatch, ...]
    """Longest any-tier prefix first."""


@dataclass(frozen=True, slots=True)
class ClusterStats:
    hits: HitStats
    live_nodes: int
    indexed_blocks: int
    state_store: str


@dataclass(frozen=True, slots=True)
class WatchedNode:
    """A live node as a watcher of the index needs it (WatchIndex)."""

    node_id: NodeId
    layout: str
    transfer_address: str
    block_size: int
    load: NodeLoad


@dataclass(frozen=True, slots=True)
class NodeBlocks:
    """One node's block changes, applied like an EventBatch; `replace`: `events` (BlockStored chains)
    become its whole block set, as SyncSnapshot does."""

    node_id: NodeId
    events: tuple[CacheEvent, ...]
    replace: bool = False


@dataclass(frozen=True, slots=True)
class IndexUpdate:
    """One change of the service's state as WatchIndex streams it; applied in the order left, nodes,
    blocks. `reset`: a snapshot, so the watcher forgets everything first."""

    seq: int
    reset: bool = False
    left: tuple[NodeId, ...] = ()
    nodes: tuple[WatchedNode, ...] = ()
    blocks: tuple[NodeBlocks, ...] = ()
    incarnation: str = ""
    """The serving process; a new one always starts its streams with a reset."""
    work: tuple["RoutedWork", ...] = ()
    """Requests routers routed since the last update (never part of a snapshot)."""


@dataclass(frozen=True, slots=True)
class RoutedWork:
    """Prompt tokens router `router_id` sent to `node_id`."""

    router_id: str
    node_id: NodeId
    tokens: int


@dataclass(frozen=True, slots=True)
class MatchPrediction:
    """What a router's own replica predicted for one request, in tokens (Match's prediction)."""

    request_id: str
    cluster_tokens: int
    local_tokens: dict[NodeId, int]
    routed_node: NodeId | None = None
    """Where the router sent the request (shared with the other routers as RoutedWork)."""
    routed_tokens: int = 0

    def __post_init__(self) -> None:
        check_text("request id", self.request_id, MAX_REQUEST_ID_CHARS)
        if min(self.cluster_tokens, self.routed_tokens, *self.local_tokens.values()) < 0:
            raise ValueError("predicted tokens must be >= 0")
