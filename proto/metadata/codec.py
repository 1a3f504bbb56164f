"""The one place that converts between protobuf messages (radixmesh.v1) and radixmesh's dataclasses.

`*_from_pb` raise ValueError for input no dataclass can represent (an unspecified tier, an empty
event); range and size checks belong to the dataclasses and to MetadataService.
"""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict
from typing import cast

from radixmesh.proto import radixmesh_pb2 as pb
from radixmesh.proto.block_hash import HASH_BYTES, BlockHash
from radixmesh.proto.events import AllCleared, BlockRemoved, BlockStored, CacheEvent, Tier
from radixmesh.proto.ids import NodeId
from radixmesh.proto.metadata.hits import COUNTER_FIELDS, HitCounters, HitStats, RequestHits
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
from radixmesh.proto.serve.tokens import TokenSources

_TIER_TO_PB = {Tier.GPU: pb.TIER_GPU, Tier.HOST: pb.TIER_HOST, Tier.DISK: pb.TIER_DISK}
# keyed by int: a message may carry any wire value (TIER_UNSPECIFIED, or one a newer peer added)
_TIER_FROM_PB: dict[int, Tier] = {v: k for k, v in _TIER_TO_PB.items()}
_STATUS_TO_PB = {PublishStatus.OK: pb.PublishAck.OK, PublishStatus.RESYNC: pb.PublishAck.RESYNC}
_STATUS_FROM_PB = {v: k for k, v in _STATUS_TO_PB.items()}


def tier_from_pb(tier: int) -> Tier:
    if tier not in _TIER_FROM_PB:
        raise ValueError(f"tier must be TIER_GPU, TIER_HOST or TIER_DISK, got {tier}")
    return _TIER_FROM_PB[tier]


def _hashes(raw: Iterable[bytes]) -> tuple[BlockHash, ...]:
    # BlockHash is a NewType over bytes: a cast, not a per-hash call, on the Match hot path.
    return cast(tuple[BlockHash, ...], tuple(raw))


def _parent(raw: bytes) -> BlockHash | None:
    return BlockHash(raw) if raw else None


def node_info_to_pb(info: NodeInfo) -> pb.RegisterNodeRequest:
    return pb.RegisterNodeRequest(
        node_id=info.node_id,
        epoch=info.epoch,
        layout_fingerprint=info.layout,
        block_size=info.block_size,
        block_bytes=info.block_bytes,
        transfer_address=info.transfer_address,
        capacity_blocks=info.capacity_blocks,
        role=info.role,
    )


def node_info_from_pb(m: pb.RegisterNodeRequest) -> NodeInfo:
    return NodeInfo(
        NodeId(m.node_id),
        m.epoch,
        m.layout_fingerprint,
        m.block_size,
        m.block_bytes,
        m.transfer_address,
        m.capacity_blocks,
        m.role or "both",  # a node of an older release declares none
    )


def lease_to_pb(lease: Lease) -> pb.Lease:
    return pb.Lease(
        node_id=lease.node_id,
        epoch=lease.epoch,
        ttl_s=lease.ttl_s,
        next_seq=lease.next_seq,
        snapshot_required=lease.snapshot_required,
        recalled=lease.recalled,
    )


def lease_from_pb(m: pb.Lease) -> Lease:
    recalled = _hashes(m.recalled)
    if any(len(h) != HASH_BYTES for h in recalled):
        raise ValueError(f"recalled block hashes must be {HASH_BYTES} bytes each")
    return Lease(NodeId(m.node_id), m.epoch, m.ttl_s, m.next_seq, m.snapshot_required, recalled)


def load_to_pb(load: NodeLoad) -> pb.NodeLoad:
    return pb.NodeLoad(
        queued_requests=load.queued_requests,
        running_tokens=load.running_tokens,
        free_blocks=load.free_blocks,
        prefill_tokens_per_s=load.prefill_tokens_per_s,
        pull_gbps=load.pull_gbps,
        pull_latency_s=load.pull_latency_s,
        compute_group=load.compute_group,
        disk_read_gbps=load.disk_read_gbps,
        step_floor_s=load.step_floor_s,
        compute_share=load.compute_share,
    )


def load_from_pb(m: pb.NodeLoad) -> NodeLoad:
    return NodeLoad(m.queued_requests, m.running_tokens, m.free_blocks, m.prefill_tokens_per_s, dict(m.pull_gbps),
                    dict(m.pull_latency_s), m.compute_group, m.disk_read_gbps, m.step_floor_s,
                    m.compute_share)


def hits_to_pb(h: RequestHits) -> pb.RequestHits:
    t = h.tokens
    return pb.RequestHits(request_id=h.request_id, tenant=h.tenant, prompt_tokens=t.prompt,
                          local_gpu_tokens=t.local_gpu, local_host_tokens=t.local_host,
                          local_disk_tokens=t.local_disk, remote_tokens=t.remote)


def hits_from_pb(m: pb.RequestHits) -> RequestHits:
    """ValueError when the hits exceed the prompt."""
    tokens = TokenSources.of_prompt(m.prompt_tokens, local_gpu=m.local_gpu_tokens,
                                    local_host=m.local_host_tokens, local_disk=m.local_disk_tokens,
                                    remote=m.remote_tokens)
    return RequestHits(m.request_id, m.tenant, tokens)


def heartbeat_to_pb(node: NodeId, epoch: int, load: NodeLoad, hits: Sequence[RequestHits]) -> pb.HeartbeatRequest:
    return pb.HeartbeatRequest(
        node_id=node, epoch=epoch, load=load_to_pb(load), hits=[hits_to_pb(h) for h in hits]
    )


def stored_to_pb(e: BlockStored) -> pb.BlockStored:
    return pb.BlockStored(hashes=e.hashes, parent=e.parent or b"", tier=_TIER_TO_PB[e.tier])


def stored_from_pb(m: pb.BlockStored) -> BlockStored:
    return BlockStored(_hashes(m.hashes), _parent(m.parent), tier_from_pb(m.tier))


def event_to_pb(e: CacheEvent) -> pb.CacheEvent:
    if isinstance(e, BlockStored):
        return pb.CacheEvent(stored=stored_to_pb(e))
    if isinstance(e, BlockRemoved):
        return pb.CacheEvent(removed=pb.BlockRemoved(hashes=e.hashes, tier=_TIER_TO_PB[e.tier]))
    return pb.CacheEvent(cleared=pb.AllCleared())


def event_from_pb(m: pb.CacheEvent) -> CacheEvent:
    kind = m.WhichOneof("event")
    if kind == "stored":
        return stored_from_pb(m.stored)
    if kind == "removed":
        return BlockRemoved(_hashes(m.removed.hashes), tier_from_pb(m.removed.tier))
    if kind == "cleared":
        return AllCleared()
    raise ValueError("a CacheEvent must set stored, removed or cleared")


def batch_to_pb(b: EventBatch) -> pb.EventBatch:
    return pb.EventBatch(node_id=b.node_id, epoch=b.epoch, seq=b.seq, events=[event_to_pb(e) for e in b.events])


def batch_from_pb(m: pb.EventBatch) -> EventBatch:
    return EventBatch(NodeId(m.node_id), m.epoch, m.seq, tuple(event_from_pb(e) for e in m.events))


def snapshot_to_pb(s: NodeSnapshot) -> pb.NodeSnapshot:
    return pb.NodeSnapshot(
        node_id=s.node_id, epoch=s.epoch, seq=s.seq, chains=[stored_to_pb(c) for c in s.chains]
    )


def snapshot_from_pb(m: pb.NodeSnapshot) -> NodeSnapshot:
    return NodeSnapshot(NodeId(m.node_id), m.epoch, m.seq, tuple(stored_from_pb(c) for c in m.chains))


def ack_to_pb(a: PublishAck) -> pb.PublishAck:
    return pb.PublishAck(status=_STATUS_TO_PB[a.status], next_seq=a.next_seq)


def ack_from_pb(m: pb.PublishAck) -> PublishAck:
    if m.status not in _STATUS_FROM_PB:
        raise ValueError(f"unknown PublishAck status {m.status}")
    return PublishAck(_STATUS_FROM_PB[m.status], m.next_seq)


def match_request_to_pb(queries: Sequence[MatchQuery]) -> pb.MatchRequest:
    return pb.MatchRequest(
        queries=[
            pb.MatchQuery(
                layout_fingerprint=q.layout,
                tenant=q.tenant,
                hashes=q.hashes,
                request_id=q.request_id or "",
                include_all_nodes=q.include_all_nodes,
            )
            for q in queries
        ]
    )


def match_request_from_pb(m: pb.MatchRequest) -> list[MatchQuery]:
    return [
        MatchQuery(q.layout_fingerprint, _hashes(q.hashes), q.tenant, q.request_id or None, q.include_all_nodes)
        for q in m.queries
    ]


def match_response_to_pb(results: Sequence[MatchResult]) -> pb.MatchResponse:
    out = pb.MatchResponse()
    for r in results:
        res = out.results.add(cluster_blocks=r.cluster_blocks)
        for n in r.nodes:
            res.nodes.add(
                node_id=n.node_id,
                transfer_address=n.transfer_address,
                gpu_blocks=n.gpu_blocks,
                host_blocks=n.host_blocks,
                any_tier_blocks=n.any_tier_blocks,
                load=load_to_pb(n.load),
            )
    return out


def match_response_from_pb(m: pb.MatchResponse) -> list[MatchResult]:
    return [
        MatchResult(
            r.cluster_blocks,
            tuple(
                NodeMatch(
                    NodeId(n.node_id),
                    n.transfer_address,
                    n.gpu_blocks,
                    n.host_blocks,
                    n.any_tier_blocks,
                    load_from_pb(n.load),
                )
                for n in r.nodes
            ),
        )
        for r in m.results
    ]


def counters_to_pb(c: HitCounters) -> pb.HitCounters:
    return pb.HitCounters(**asdict(c), hit_rate=c.hit_rate, index_precision=c.index_precision)


def counters_from_pb(m: pb.HitCounters) -> HitCounters:
    return HitCounters(**{name: getattr(m, name) for name in COUNTER_FIELDS})


def stats_to_pb(s: ClusterStats) -> pb.ClusterStats:
    return pb.ClusterStats(
        total=counters_to_pb(s.hits.total),
        per_node={k: counters_to_pb(v) for k, v in s.hits.per_node.items()},
        per_tenant={k: counters_to_pb(v) for k, v in s.hits.per_tenant.items()},
        live_nodes=s.live_nodes,
        indexed_blocks=s.indexed_blocks,
        state_store=s.state_store,
    )


def stats_from_pb(m: pb.ClusterStats) -> ClusterStats:
    hits = HitStats(
        counters_from_pb(m.total),
        {k: counters_from_pb(v) for k, v in m.per_node.items()},
        {k: counters_from_pb(v) for k, v in m.per_tenant.items()},
    )
    return ClusterStats(hits, m.live_nodes, m.indexed_blocks, m.state_store)


def encode_stored_index(snapshots: Sequence[NodeSnapshot]) -> bytes:
    """The index as the service persists it: one NodeSnapshot per live node."""
    return pb.StoredIndex(nodes=[snapshot_to_pb(s) for s in snapshots]).SerializeToString()


def decode_stored_index(blob: bytes) -> list[NodeSnapshot]:
    return [snapshot_from_pb(s) for s in pb.StoredIndex.FromString(blob).nodes]


def update_to_pb(u: IndexUpdate) -> pb.IndexUpdate:
    return pb.IndexUpdate(
        seq=u.seq,
        reset=u.reset,
        left=u.left,
        nodes=[
            pb.WatchedNode(node_id=n.node_id, layout_fingerprint=n.layout, transfer_address=n.transfer_address,
                           block_size=n.block_size, load=load_to_pb(n.load))
            for n in u.nodes
        ],
        blocks=[
            pb.NodeBlocks(node_id=b.node_id, replace=b.replace, events=[event_to_pb(e) for e in b.events])
            for b in u.blocks
        ],
        incarnation=u.incarnation,
        work=[pb.RoutedWork(router_id=w.router_id, node_id=w.node_id, tokens=w.tokens) for w in u.work],
    )


def update_from_pb(m: pb.IndexUpdate) -> IndexUpdate:
    return IndexUpdate(
        m.seq,
        m.reset,
        tuple(NodeId(n) for n in m.left),
        tuple(
            WatchedNode(NodeId(n.node_id), n.layout_fingerprint, n.transfer_address, n.block_size,
                        load_from_pb(n.load))
            for n in m.nodes
        ),
        tuple(NodeBlocks(NodeId(b.node_id), tuple(event_from_pb(e) for e in b.events), b.replace) for b in m.blocks),
        m.incarnation,
        tuple(RoutedWork(w.router_id, NodeId(w.node_id), w.tokens) for w in m.work),
    )


def predictions_to_pb(predictions: Sequence[MatchPrediction], router_id: str = "") -> pb.PredictionBatch:
    return pb.PredictionBatch(
        predictions=[
            # NodeId is a NewType over str and a Mapping's key type is invariant: a cast, not a copy
            pb.Prediction(request_id=p.request_id, cluster_tokens=p.cluster_tokens,
                          local_tokens=cast(Mapping[str, int], p.local_tokens),
                          routed_node=p.routed_node or "", routed_tokens=p.routed_tokens)
            for p in predictions
        ],
        router_id=router_id,
    )


def predictions_from_pb(m: pb.PredictionBatch) -> tuple[str, list[MatchPrediction]]:
    """(router id, predictions)."""
    return m.router_id, [
        MatchPrediction(p.request_id, p.cluster_tokens, {NodeId(k): v for k, v in p.local_tokens.items()},
                        NodeId(p.routed_node) if p.routed_node else None, p.routed_tokens)
        for p in m.predictions
    ]
