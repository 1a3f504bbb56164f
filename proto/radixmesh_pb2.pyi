from collections.abc import Iterable as _Iterable
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar

from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper

DESCRIPTOR: _descriptor.FileDescriptor

class Tier(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TIER_UNSPECIFIED: _ClassVar[Tier]
    TIER_GPU: _ClassVar[Tier]
    TIER_HOST: _ClassVar[Tier]
TIER_UNSPECIFIED: Tier
TIER_GPU: Tier
TIER_HOST: Tier

class RegisterNodeRequest(_message.Message):
    __slots__ = ("block_size", "capacity_blocks", "epoch", "layout_fingerprint", "node_id", "transfer_address")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    epoch: int
    layout_fingerprint: str
    block_size: int
    transfer_address: str
    capacity_blocks: int
    def __init__(self, node_id: str | None = ..., epoch: int | None = ..., layout_fingerprint: str | None = ..., block_size: int | None = ..., transfer_address: str | None = ..., capacity_blocks: int | None = ...) -> None: ...

class Lease(_message.Message):
    __slots__ = ("epoch", "next_seq", "node_id", "snapshot_required", "ttl_s")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    TTL_S_FIELD_NUMBER: _ClassVar[int]
    NEXT_SEQ_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_REQUIRED_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    epoch: int
    ttl_s: float
    next_seq: int
    snapshot_required: bool
    def __init__(self, node_id: str | None = ..., epoch: int | None = ..., ttl_s: float | None = ..., next_seq: int | None = ..., snapshot_required: bool | None = ...) -> None: ...

class NodeLoad(_message.Message):
    __slots__ = ("free_blocks", "prefill_tokens_per_s", "pull_gbps", "queued_requests", "running_tokens")
    class PullGbpsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: str | None = ..., value: float | None = ...) -> None: ...
    QUEUED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FREE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    PULL_GBPS_FIELD_NUMBER: _ClassVar[int]
    queued_requests: int
    running_tokens: int
    free_blocks: int
    prefill_tokens_per_s: float
    pull_gbps: _containers.ScalarMap[str, float]
    def __init__(self, queued_requests: int | None = ..., running_tokens: int | None = ..., free_blocks: int | None = ..., prefill_tokens_per_s: float | None = ..., pull_gbps: _Mapping[str, float] | None = ...) -> None: ...

class RequestHits(_message.Message):
    __slots__ = ("local_gpu_tokens", "local_host_tokens", "prompt_tokens", "remote_tokens", "request_id", "tenant")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LOCAL_GPU_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LOCAL_HOST_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REMOTE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    tenant: str
    prompt_tokens: int
    local_gpu_tokens: int
    local_host_tokens: int
    remote_tokens: int
    def __init__(self, request_id: str | None = ..., tenant: str | None = ..., prompt_tokens: int | None = ..., local_gpu_tokens: int | None = ..., local_host_tokens: int | None = ..., remote_tokens: int | None = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("epoch", "hits", "load", "node_id")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    epoch: int
    load: NodeLoad
    hits: _containers.RepeatedCompositeFieldContainer[RequestHits]
    def __init__(self, node_id: str | None = ..., epoch: int | None = ..., load: NodeLoad | _Mapping | None = ..., hits: _Iterable[RequestHits | _Mapping] | None = ...) -> None: ...

class BlockStored(_message.Message):
    __slots__ = ("hashes", "parent", "tier")
    HASHES_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    hashes: _containers.RepeatedScalarFieldContainer[bytes]
    parent: bytes
    tier: Tier
    def __init__(self, hashes: _Iterable[bytes] | None = ..., parent: bytes | None = ..., tier: Tier | str | None = ...) -> None: ...

class BlockRemoved(_message.Message):
    __slots__ = ("hashes", "tier")
    HASHES_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    hashes: _containers.RepeatedScalarFieldContainer[bytes]
    tier: Tier
    def __init__(self, hashes: _Iterable[bytes] | None = ..., tier: Tier | str | None = ...) -> None: ...

class AllCleared(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CacheEvent(_message.Message):
    __slots__ = ("cleared", "removed", "stored")
    STORED_FIELD_NUMBER: _ClassVar[int]
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    CLEARED_FIELD_NUMBER: _ClassVar[int]
    stored: BlockStored
    removed: BlockRemoved
    cleared: AllCleared
    def __init__(self, stored: BlockStored | _Mapping | None = ..., removed: BlockRemoved | _Mapping | None = ..., cleared: AllCleared | _Mapping | None = ...) -> None: ...

class EventBatch(_message.Message):
    __slots__ = ("epoch", "events", "node_id", "seq")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    epoch: int
    seq: int
    events: _containers.RepeatedCompositeFieldContainer[CacheEvent]
    def __init__(self, node_id: str | None = ..., epoch: int | None = ..., seq: int | None = ..., events: _Iterable[CacheEvent | _Mapping] | None = ...) -> None: ...

class PublishAck(_message.Message):
    __slots__ = ("next_seq", "status")
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
    def __init__(self, status: PublishAck.Status | str | None = ..., next_seq: int | None = ...) -> None: ...

class NodeSnapshot(_message.Message):
    __slots__ = ("chains", "epoch", "node_id", "seq")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    CHAINS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    epoch: int
    seq: int
    chains: _containers.RepeatedCompositeFieldContainer[BlockStored]
    def __init__(self, node_id: str | None = ..., epoch: int | None = ..., seq: int | None = ..., chains: _Iterable[BlockStored | _Mapping] | None = ...) -> None: ...

class MatchQuery(_message.Message):
    __slots__ = ("hashes", "include_all_nodes", "layout_fingerprint", "request_id", "tenant")
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
    def __init__(self, layout_fingerprint: str | None = ..., tenant: str | None = ..., hashes: _Iterable[bytes] | None = ..., request_id: str | None = ..., include_all_nodes: bool | None = ...) -> None: ...

class MatchRequest(_message.Message):
    __slots__ = ("queries",)
    QUERIES_FIELD_NUMBER: _ClassVar[int]
    queries: _containers.RepeatedCompositeFieldContainer[MatchQuery]
    def __init__(self, queries: _Iterable[MatchQuery | _Mapping] | None = ...) -> None: ...

class NodeMatch(_message.Message):
    __slots__ = ("any_tier_blocks", "gpu_blocks", "host_blocks", "load", "node_id", "transfer_address")
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
    def __init__(self, node_id: str | None = ..., transfer_address: str | None = ..., gpu_blocks: int | None = ..., host_blocks: int | None = ..., any_tier_blocks: int | None = ..., load: NodeLoad | _Mapping | None = ...) -> None: ...

class MatchResult(_message.Message):
    __slots__ = ("cluster_blocks", "nodes")
    CLUSTER_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    cluster_blocks: int
    nodes: _containers.RepeatedCompositeFieldContainer[NodeMatch]
    def __init__(self, cluster_blocks: int | None = ..., nodes: _Iterable[NodeMatch | _Mapping] | None = ...) -> None: ...

class MatchResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[MatchResult]
    def __init__(self, results: _Iterable[MatchResult | _Mapping] | None = ...) -> None: ...

class GetStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HitCounters(_message.Message):
    __slots__ = ("cluster_cached_tokens", "hit_rate", "index_precision", "local_gpu_tokens", "local_host_tokens", "miss_tokens", "predicted_local_tokens", "prompt_tokens", "realized_local_tokens", "regret_tokens", "remote_tokens", "requests")
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
    def __init__(self, requests: int | None = ..., prompt_tokens: int | None = ..., local_gpu_tokens: int | None = ..., local_host_tokens: int | None = ..., remote_tokens: int | None = ..., miss_tokens: int | None = ..., cluster_cached_tokens: int | None = ..., regret_tokens: int | None = ..., predicted_local_tokens: int | None = ..., realized_local_tokens: int | None = ..., hit_rate: float | None = ..., index_precision: float | None = ...) -> None: ...

class ClusterStats(_message.Message):
    __slots__ = ("indexed_blocks", "live_nodes", "per_node", "per_tenant", "state_store", "total")
    class PerNodeEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: HitCounters
        def __init__(self, key: str | None = ..., value: HitCounters | _Mapping | None = ...) -> None: ...
    class PerTenantEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: HitCounters
        def __init__(self, key: str | None = ..., value: HitCounters | _Mapping | None = ...) -> None: ...
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
    def __init__(self, total: HitCounters | _Mapping | None = ..., per_node: _Mapping[str, HitCounters] | None = ..., per_tenant: _Mapping[str, HitCounters] | None = ..., live_nodes: int | None = ..., indexed_blocks: int | None = ..., state_store: str | None = ...) -> None: ...

class StoredIndex(_message.Message):
    __slots__ = ("nodes",)
    NODES_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[NodeSnapshot]
    def __init__(self, nodes: _Iterable[NodeSnapshot | _Mapping] | None = ...) -> None: ...
