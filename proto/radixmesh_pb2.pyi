from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Tier(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TIER_UNSPECIFIED: _ClassVar[Tier]
    TIER_GPU: _ClassVar[Tier]
    TIER_HOST: _ClassVar[Tier]
    TIER_DISK: _ClassVar[Tier]
TIER_UNSPECIFIED: Tier
TIER_GPU: Tier
TIER_HOST: Tier
TIER_DISK: Tier

class RegisterNodeRequest(_message.Message):
    __slots__ = ("node_id", "epoch", "layout_fingerprint", "block_size", "transfer_address", "capacity_blocks", "block_bytes", "role")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_BYTES_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    epoch: int
    layout_fingerprint: str
    block_size: int
    transfer_address: str
    capacity_blocks: int
    block_bytes: int
    role: str
    def __init__(self, node_id: _Optional[str] = ..., epoch: _Optional[int] = ..., layout_fingerprint: _Optional[str] = ..., block_size: _Optional[int] = ..., transfer_address: _Optional[str] = ..., capacity_blocks: _Optional[int] = ..., block_bytes: _Optional[int] = ..., role: _Optional[str] = ...) -> None: ...

class Lease(_message.Message):
    __slots__ = ("node_id", "epoch", "ttl_s", "next_seq", "snapshot_required", "recalled")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    TTL_S_FIELD_NUMBER: _ClassVar[int]
    NEXT_SEQ_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_REQUIRED_FIELD_NUMBER: _ClassVar[int]
    RECALLED_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    epoch: int
    ttl_s: float
    next_seq: int
    snapshot_required: bool
    recalled: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, node_id: _Optional[str] = ..., epoch: _Optional[int] = ..., ttl_s: _Optional[float] = ..., next_seq: _Optional[int] = ..., snapshot_required: _Optional[bool] = ..., recalled: _Optional[_Iterable[bytes]] = ...) -> None: ...

class NodeLoad(_message.Message):
    __slots__ = ("queued_requests", "running_tokens", "free_blocks", "prefill_tokens_per_s", "pull_gbps", "pull_latency_s", "compute_group", "disk_read_gbps", "step_floor_s", "compute_share")
    class PullGbpsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class PullLatencySEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    QUEUED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FREE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    PULL_GBPS_FIELD_NUMBER: _ClassVar[int]
    PULL_LATENCY_S_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_GROUP_FIELD_NUMBER: _ClassVar[int]
    DISK_READ_GBPS_FIELD_NUMBER: _ClassVar[int]
    STEP_FLOOR_S_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_SHARE_FIELD_NUMBER: _ClassVar[int]
    queued_requests: int
    running_tokens: int
    free_blocks: int
    prefill_tokens_per_s: float
    pull_gbps: _containers.ScalarMap[str, float]
    pull_latency_s: _containers.ScalarMap[str, float]
    compute_group: str
    disk_read_gbps: float
    step_floor_s: float
    compute_share: float
    def __init__(self, queued_requests: _Optional[int] = ..., running_tokens: _Optional[int] = ..., free_blocks: _Optional[int] = ..., prefill_tokens_per_s: _Optional[float] = ..., pull_gbps: _Optional[_Mapping[str, float]] = ..., pull_latency_s: _Optional[_Mapping[str, float]] = ..., compute_group: _Optional[str] = ..., disk_read_gbps: _Optional[float] = ..., step_floor_s: _Optional[float] = ..., compute_share: _Optional[float] = ...) -> None: ...

class RequestHits(_message.Message):
    __slots__ = ("request_id", "tenant", "prompt_tokens", "local_gpu_tokens", "local_host_tokens", "remote_tokens", "local_disk_tokens")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LOCAL_GPU_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LOCAL_HOST_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REMOTE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LOCAL_DISK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    tenant: str
    prompt_tokens: int
    local_gpu_tokens: int
    local_host_tokens: int
    remote_tokens: int
    local_disk_tokens: int
    def __init__(self, request_id: _Optional[str] = ..., tenant: _Optional[str] = ..., prompt_tokens: _Optional[int] = ..., local_gpu_tokens: _Optional[int] = ..., local_host_tokens: _Optional[int] = ..., remote_tokens: _Optional[int] = ..., local_disk_tokens: _Optional[int] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("node_id", "epoch", "load", "hits")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    epoch: int
    load: NodeLoad
    hits: _containers.RepeatedCompositeFieldContainer[RequestHits]
    def __init__(self, node_id: _Optional[str] = ..., epoch: _Optional[int] = ..., load: _Optional[_Union[NodeLoad, _Mapping]] = ..., hits: _Optional[_Iterable[_Union[RequestHits, _Mapping]]] = ...) -> None: ...

class BlockStored(_message.Message):
    __slots__ = ("hashes", "parent", "tier")
    HASHES_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    hashes: _containers.RepeatedScalarFieldContainer[bytes]
    parent: bytes
    tier: Tier
    def __init__(self, hashes: _Optional[_Iterable[bytes]] = ..., parent: _Optional[bytes] = ..., tier: _Optional[_Union[Tier, str]] = ...) -> None: ...

class BlockRemoved(_message.Message):
    __slots__ = ("hashes", "tier")
    HASHES_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    hashes: _containers.RepeatedScalarFieldContainer[bytes]
    tier: Tier
    def __init__(self, hashes: _Optional[_Iterable[bytes]] = ..., tier: _Optional[_Union[Tier, str]] = ...) -> None: ...

class AllCleared(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CacheEvent(_message.Message):
    __slots__ = ("stored", "removed", "cleared")
    STORED_FIELD_NUMBER: _ClassVar[int]
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    CLEARED_FIELD_NUMBER: _ClassVar[int]
    stored: BlockStored
    removed: BlockRemoved
    cleared: AllCleared
    def __init__(self, stored: _Optional[_Union[BlockStored, _Mapping]] = ..., removed: _Optional[_Union[BlockRemoved, _Mapping]] = ..., cleared: _Optional[_Union[AllCleared, _Mapping]] = ...) -> None: ...

class EventBatch(_message.Message):
    __slots__ = ("node_id", "epoch", "seq", "events")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    epoch: int
    seq: int
    events: _containers.RepeatedCompositeFieldContainer[CacheEvent]
    def __init__(self, node_id: _Optional[str] = ..., epoch: _Optional[int] = ..., seq: _Optional[int] = ..., events: _Optional[_Iterable[_Union[CacheEvent, _Mapping]]] = ...) -> None: ...

class PublishAck(_message.Message):
    __slots__ = ("status", "next_seq")
    class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        STATUS_UNSPECIFIED: _ClassVar[PublishAck.Status]
        OK: _ClassVar[PublishAck.Status]
        RESYNC: _ClassVar[PublishAck.Status]
    STATUS_UNSPECIFIED: PublishAck.Status
    OK: PublishAck.Status
    RESYNC: PublishAck.Status
    STATUS_FIELD_NUMBER: _ClassVar[int]
    NEXT_SEQ_FIELD_NUMBER: _ClassVar[int]
    status: PublishAck.Status
    next_seq: int
    def __init__(self, status: _Optional[_Union[PublishAck.Status, str]] = ..., next_seq: _Optional[int] = ...) -> None: ...

class NodeSnapshot(_message.Message):
    __slots__ = ("node_id", "epoch", "seq", "chains")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    CHAINS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    epoch: int
    seq: int
    chains: _containers.RepeatedCompositeFieldContainer[BlockStored]
    def __init__(self, node_id: _Optional[str] = ..., epoch: _Optional[int] = ..., seq: _Optional[int] = ..., chains: _Optional[_Iterable[_Union[BlockStored, _Mapping]]] = ...) -> None: ...

class MatchQuery(_message.Message):
    __slots__ = ("layout_fingerprint", "tenant", "hashes", "request_id", "include_all_nodes")
    LAYOUT_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    HASHES_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_ALL_NODES_FIELD_NUMBER: _ClassVar[int]
    layout_fingerprint: str
    tenant: str
    hashes: _containers.RepeatedScalarFieldContainer[bytes]
    request_id: str
    include_all_nodes: bool
    def __init__(self, layout_fingerprint: _Optional[str] = ..., tenant: _Optional[str] = ..., hashes: _Optional[_Iterable[bytes]] = ..., request_id: _Optional[str] = ..., include_all_nodes: _Optional[bool] = ...) -> None: ...

class MatchRequest(_message.Message):
    __slots__ = ("queries",)
    QUERIES_FIELD_NUMBER: _ClassVar[int]
    queries: _containers.RepeatedCompositeFieldContainer[MatchQuery]
    def __init__(self, queries: _Optional[_Iterable[_Union[MatchQuery, _Mapping]]] = ...) -> None: ...

class NodeMatch(_message.Message):
    __slots__ = ("node_id", "transfer_address", "gpu_blocks", "host_blocks", "any_tier_blocks", "load")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    GPU_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    HOST_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    ANY_TIER_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    transfer_address: str
    gpu_blocks: int
    host_blocks: int
    any_tier_blocks: int
    load: NodeLoad
    def __init__(self, node_id: _Optional[str] = ..., transfer_address: _Optional[str] = ..., gpu_blocks: _Optional[int] = ..., host_blocks: _Optional[int] = ..., any_tier_blocks: _Optional[int] = ..., load: _Optional[_Union[NodeLoad, _Mapping]] = ...) -> None: ...

class MatchResult(_message.Message):
    __slots__ = ("cluster_blocks", "nodes")
    CLUSTER_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    cluster_blocks: int
    nodes: _containers.RepeatedCompositeFieldContainer[NodeMatch]
    def __init__(self, cluster_blocks: _Optional[int] = ..., nodes: _Optional[_Iterable[_Union[NodeMatch, _Mapping]]] = ...) -> None: ...

class MatchResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[MatchResult]
    def __init__(self, results: _Optional[_Iterable[_Union[MatchResult, _Mapping]]] = ...) -> None: ...

class GetStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HitCounters(_message.Message):
    __slots__ = ("requests", "prompt_tokens", "local_gpu_tokens", "local_host_tokens", "remote_tokens", "miss_tokens", "cluster_cached_tokens", "regret_tokens", "predicted_local_tokens", "realized_local_tokens", "hit_rate", "index_precision", "local_disk_tokens")
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LOCAL_GPU_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LOCAL_HOST_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REMOTE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MISS_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REGRET_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_LOCAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REALIZED_LOCAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    HIT_RATE_FIELD_NUMBER: _ClassVar[int]
    INDEX_PRECISION_FIELD_NUMBER: _ClassVar[int]
    LOCAL_DISK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    requests: int
    prompt_tokens: int
    local_gpu_tokens: int
    local_host_tokens: int
    remote_tokens: int
    miss_tokens: int
    cluster_cached_tokens: int
    regret_tokens: int
    predicted_local_tokens: int
    realized_local_tokens: int
    hit_rate: float
    index_precision: float
    local_disk_tokens: int
    def __init__(self, requests: _Optional[int] = ..., prompt_tokens: _Optional[int] = ..., local_gpu_tokens: _Optional[int] = ..., local_host_tokens: _Optional[int] = ..., remote_tokens: _Optional[int] = ..., miss_tokens: _Optional[int] = ..., cluster_cached_tokens: _Optional[int] = ..., regret_tokens: _Optional[int] = ..., predicted_local_tokens: _Optional[int] = ..., realized_local_tokens: _Optional[int] = ..., hit_rate: _Optional[float] = ..., index_precision: _Optional[float] = ..., local_disk_tokens: _Optional[int] = ...) -> None: ...

class ClusterStats(_message.Message):
    __slots__ = ("total", "per_node", "per_tenant", "live_nodes", "indexed_blocks", "state_store")
    class PerNodeEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: HitCounters
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[HitCounters, _Mapping]] = ...) -> None: ...
    class PerTenantEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: HitCounters
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[HitCounters, _Mapping]] = ...) -> None: ...
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    PER_NODE_FIELD_NUMBER: _ClassVar[int]
    PER_TENANT_FIELD_NUMBER: _ClassVar[int]
    LIVE_NODES_FIELD_NUMBER: _ClassVar[int]
    INDEXED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    STATE_STORE_FIELD_NUMBER: _ClassVar[int]
    total: HitCounters
    per_node: _containers.MessageMap[str, HitCounters]
    per_tenant: _containers.MessageMap[str, HitCounters]
    live_nodes: int
    indexed_blocks: int
    state_store: str
    def __init__(self, total: _Optional[_Union[HitCounters, _Mapping]] = ..., per_node: _Optional[_Mapping[str, HitCounters]] = ..., per_tenant: _Optional[_Mapping[str, HitCounters]] = ..., live_nodes: _Optional[int] = ..., indexed_blocks: _Optional[int] = ..., state_store: _Optional[str] = ...) -> None: ...

class StoredIndex(_message.Message):
    __slots__ = ("nodes",)
    NODES_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[NodeSnapshot]
    def __init__(self, nodes: _Optional[_Iterable[_Union[NodeSnapshot, _Mapping]]] = ...) -> None: ...

class WatchIndexRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WatchedNode(_message.Message):
    __slots__ = ("node_id", "layout_fingerprint", "transfer_address", "block_size", "load")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    layout_fingerprint: str
    transfer_address: str
    block_size: int
    load: NodeLoad
    def __init__(self, node_id: _Optional[str] = ..., layout_fingerprint: _Optional[str] = ..., transfer_address: _Optional[str] = ..., block_size: _Optional[int] = ..., load: _Optional[_Union[NodeLoad, _Mapping]] = ...) -> None: ...

class NodeBlocks(_message.Message):
    __slots__ = ("node_id", "replace", "events")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    REPLACE_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    replace: bool
    events: _containers.RepeatedCompositeFieldContainer[CacheEvent]
    def __init__(self, node_id: _Optional[str] = ..., replace: _Optional[bool] = ..., events: _Optional[_Iterable[_Union[CacheEvent, _Mapping]]] = ...) -> None: ...

class IndexUpdate(_message.Message):
    __slots__ = ("seq", "reset", "left", "nodes", "blocks", "incarnation", "work")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    RESET_FIELD_NUMBER: _ClassVar[int]
    LEFT_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    WORK_FIELD_NUMBER: _ClassVar[int]
    seq: int
    reset: bool
    left: _containers.RepeatedScalarFieldContainer[str]
    nodes: _containers.RepeatedCompositeFieldContainer[WatchedNode]
    blocks: _containers.RepeatedCompositeFieldContainer[NodeBlocks]
    incarnation: str
    work: _containers.RepeatedCompositeFieldContainer[RoutedWork]
    def __init__(self, seq: _Optional[int] = ..., reset: _Optional[bool] = ..., left: _Optional[_Iterable[str]] = ..., nodes: _Optional[_Iterable[_Union[WatchedNode, _Mapping]]] = ..., blocks: _Optional[_Iterable[_Union[NodeBlocks, _Mapping]]] = ..., incarnation: _Optional[str] = ..., work: _Optional[_Iterable[_Union[RoutedWork, _Mapping]]] = ...) -> None: ...

class RoutedWork(_message.Message):
    __slots__ = ("router_id", "node_id", "tokens")
    ROUTER_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    router_id: str
    node_id: str
    tokens: int
    def __init__(self, router_id: _Optional[str] = ..., node_id: _Optional[str] = ..., tokens: _Optional[int] = ...) -> None: ...

class Prediction(_message.Message):
    __slots__ = ("request_id", "cluster_tokens", "local_tokens", "routed_node", "routed_tokens")
    class LocalTokensEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LOCAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ROUTED_NODE_FIELD_NUMBER: _ClassVar[int]
    ROUTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    cluster_tokens: int
    local_tokens: _containers.ScalarMap[str, int]
    routed_node: str
    routed_tokens: int
    def __init__(self, request_id: _Optional[str] = ..., cluster_tokens: _Optional[int] = ..., local_tokens: _Optional[_Mapping[str, int]] = ..., routed_node: _Optional[str] = ..., routed_tokens: _Optional[int] = ...) -> None: ...

class PredictionBatch(_message.Message):
    __slots__ = ("predictions", "router_id")
    PREDICTIONS_FIELD_NUMBER: _ClassVar[int]
    ROUTER_ID_FIELD_NUMBER: _ClassVar[int]
    predictions: _containers.RepeatedCompositeFieldContainer[Prediction]
    router_id: str
    def __init__(self, predictions: _Optional[_Iterable[_Union[Prediction, _Mapping]]] = ..., router_id: _Optional[str] = ...) -> None: ...

class ReportAck(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
