"""Settings of one node agent: which model, how its engine batches, where it listens, whom it tells."""

from dataclasses import dataclass, field
from pathlib import Path

from radixmesh.common.block_pool.eviction import DEFAULT_HANDOFF
from radixmesh.common.block_pool.recall import DEFAULT_RECALL_BLOCKS
from radixmesh.common.secret import ClusterSecret
from radixmesh.node_agent.engine.config import EngineConfig
from radixmesh.node_agent.kv_events.endpoint import check_endpoint
from radixmesh.node_agent.memory.disk.tier import GB, DiskConfig
from radixmesh.node_agent.model.modeled.spec import ModeledEngine
from radixmesh.node_agent.model.source import ModelSource, random_source
from radixmesh.proto.ids import NodeId
from radixmesh.proto.kv_layout import KV_DTYPES
from radixmesh.proto.metadata.limits import check_node_id
from radixmesh.proto.metadata.nodes import NODE_ROLES

TRANSFER_PLANES = ("none", "ucx", "ray", "auto")


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """One node agent. Every agent of one layout must share its model and engine block size, so that a
    block hash names the same KV bytes on every node."""

    node_id: NodeId
    model: ModelSource = field(default_factory=random_source)
    """The model (model.source.resolve_model): the same on every agent of a layout."""
    role: str = "both"
    """Which phase the router sends this agent (proto.metadata.nodes.NODE_ROLES): "both" (aggregated),
    "prefill" or "decode". It registers it with the rest of its NodeInfo; the engine is the same."""
    served_model_name: str = ""
    """The model id clients name (`up --served-model-name`), which labels every metric `model_name`;
    "": the model's own name."""
    engine: EngineConfig = field(default_factory=EngineConfig)
    modeled: ModeledEngine | None = None
    """Replace the model's forward by a profile's time model (model.modeled: `--engine modeled:PROFILE`);
    everything else runs for real, on the CPU, with a KV of 32 bytes a token. None: the real model."""
    device: str = "auto"
    """Where the model, its pools and kernels run: "auto" (the GPU the agent's actor was given, else
    the CPU), "cpu" or "cuda[:i]"."""
    dtype: str = "auto"
    """Weights and KV precision: "auto" (bfloat16 on a GPU, float32 on the CPU), "float32", "float16",
    "bfloat16"."""
    gpu_memory_utilization: float | None = None
    """On a GPU: size the gpu tier from this share of the device's memory, less the weights and a
    measured activation peak (engine.gpu_budget), instead of engine.memory.num_gpu_blocks."""
    host: str = "127.0.0.1"
    """Address the transfer server binds (and advertises)."""
    transfer_port: int = 0
    """0: any free port."""
    metrics_port: int | None = None
    """Port of the agent's own GET /metrics on `host` (0: any free port; None: no endpoint, the
    router's merged /metrics still has it). Off loopback it requires the metrics token
    (common.metrics.scrape.metrics_token)."""
    metrics_tls: bool = True
    """Off loopback, serve that /metrics over TLS with a certificate minted from the cluster secret's CA
    (common.metrics.scrape.MetricsServer.for_agent). False: plain text (`up --no-tls`)."""
    zone: str = ""
    """Availability zone of the agent's machine, a label of its scrape target ("": unknown; the agent
    actor fills it from the Ray node's `ray.io/availability-zone` label)."""
    transfer: str = "ucx"
    """KV transfer plane: "ucx" (TCP on one machine, RDMA on a cluster), "ray" (the Ray object store,
    served by the agent's actor: only for agents made by make_agent_actor), "auto" (ucx where `import
    ucxx` works, else ray) or "none" (never pulls, serves no pulls; planned pulls are recomputed)."""
    secret: ClusterSecret = field(default_factory=ClusterSecret.generate)
    """The cluster secret: this node's credential (metadata RPCs, transfer handshake) derives from it.
    Every agent of a deployment must share it (the launcher hands its one to all); the default, a
    fresh one, suits an agent that pulls from nobody. The block-hash key is `engine.memory.hash_key`
    (the launcher derives it from this secret)."""
    transfer_mac: bool = False
    """Verify a keyed MAC of every pulled chunk (PullConfig.mac)."""
    handoff: bool = DEFAULT_HANDOFF
    """Hand-off: once a peer has been sent every block of a pull, those blocks go first when this
    agent evicts (TransferSource.handoff), so a conversation that moved keeps one copy in the
    cluster, not two. The eviction order itself is `engine.memory.pool.eviction`. Off by default:
    the simulator's best row uses it, but it has not been measured on real traffic yet."""
    recall_blocks: int = DEFAULT_RECALL_BLOCKS
    """The cluster's ghost on this agent: how many of the hashes the metadata service reports as
    last-copy evictions (with each heartbeat's lease) it remembers; a block stored again under one
    is kept as re-used (PoolHooks.recalled; the ``s3fifo`` order uses it). 0: off."""
    pull_timeout_s: float = 10.0
    """Bound on one pull; past it the missing blocks are recomputed."""
    max_requests: int = 512
    """Requests this agent holds at once (queued or running); past it new plans are refused with
    AgentBusy, so several routers cannot pile up an unbounded queue on one node."""
    metadata_address: str | None = None
    """host:port of the metadata service; None runs standalone (no events, no heartbeats)."""
    metadata_root_certificates: bytes | None = None
    """PEM certificates the metadata service's TLS certificate must chain to; None: plain gRPC."""
    heartbeat_interval_s: float = 1.0
    publish_interval_s: float = 0.05
    """How long cache events are batched before they are sent."""
    kv_events_endpoint: str | None = None
    """Also publish the cache events in vLLM's ZMQ format (kv_events.publisher) on this PUB address,
    tcp://host:port or ipc://path, with the replay socket beside it (kv_events.endpoint); None: not."""
    kv_events_allow_remote: bool = False
    """Let `kv_events_endpoint` be a non-loopback address: vLLM's event sockets carry no authentication."""
    kv_events_token_ids: bool = False
    """Put each stored block's token ids and its chain's cache salt in the KV events (the prompts, to
    whoever reaches the socket). Off: hashes, parents and media only, which no consumer can match to a
    prompt; indexers that rebuild hashes from tokens (vLLM's, radixmesh's ingest) need it on."""
    disk_cache: str | None = None
    """Directory of this agent's disk tier (memory.disk), under its host tier (a small one when none is
    configured: MemoryConfig.host_blocks): prefix blocks the host evicts, and on a clean stop every
    cached block, are written there and read back on a host miss, and a restarted agent finds them
    again. One directory per agent. None: no disk tier."""
    disk_cache_bytes: int = 10 * GB
    """Bound on the disk tier's files (with `disk_cache`)."""
    host_cache_bytes: int = 0
    """Size of the host tier in bytes (SGLang and LMCache size theirs so), converted at start with the
    model's KV bytes per block (host_blocks_of); it replaces engine.memory.num_host_blocks, which must
    then be 0. 0: num_host_blocks decides."""

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model.name

    @property
    def engine_label(self) -> str:
        """What figures from this agent are labelled: "real" or "modeled:<profile>"."""
        return "real" if self.modeled is None else self.modeled.label

    def host_blocks_of(self, block_bytes: int) -> int:
        """The host tier's blocks when one block's KV weighs `block_bytes`: host_cache_bytes in whole
        blocks, else num_host_blocks. ValueError when host_cache_bytes holds no block."""
        if not self.host_cache_bytes:
            return self.engine.memory.num_host_blocks
        if self.host_cache_bytes < block_bytes:
            raise ValueError(f"a host cache of {self.host_cache_bytes} bytes holds no block of this model's "
                             f"{block_bytes} bytes of KV: give it more")
        return self.host_cache_bytes // block_bytes

    @property
    def disk(self) -> DiskConfig | None:
        """The disk tier's settings (None without `disk_cache`)."""
        return DiskConfig(Path(self.disk_cache), self.disk_cache_bytes) if self.disk_cache else None

    def __post_init__(self) -> None:
        check_node_id(self.node_id)
        if self.role not in NODE_ROLES:
            raise ValueError(f"role must be one of {', '.join(NODE_ROLES)}, got {self.role!r}")
        if self.dtype != "auto" and self.dtype not in KV_DTYPES:
            raise ValueError(f"dtype must be auto or one of {', '.join(KV_DTYPES)}, got {self.dtype!r}")
        if self.modeled is not None and (self.device not in ("auto", "cpu") or self.dtype not in ("auto", "float32")
                                         or self.gpu_memory_utilization is not None):
            raise ValueError("a modeled engine runs on the CPU in float32 and sizes its pool from the profile: "
                             "leave device, dtype and gpu_memory_utilization unset")
        if self.gpu_memory_utilization is not None and not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.transfer not in TRANSFER_PLANES:
            raise ValueError(f"transfer must be one of {TRANSFER_PLANES}, got {self.transfer!r}")
        if self.max_requests < 1:
            raise ValueError(f"max_requests must be >= 1, got {self.max_requests}")
        for name in ("transfer_port", "metrics_port"):
            port = getattr(self, name)
            if port is not None and not 0 <= port < 65536:
                raise ValueError(f"{name} must be in [0, 65535], got {port}")
        if self.recall_blocks < 0:
            raise ValueError(f"recall_blocks must be >= 0, got {self.recall_blocks}")
        if self.kv_events_endpoint is not None:
            check_endpoint(self.kv_events_endpoint, allow_remote=self.kv_events_allow_remote)
        for name in ("pull_timeout_s", "heartbeat_interval_s", "publish_interval_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.host_cache_bytes < 0 or (self.host_cache_bytes and self.engine.memory.num_host_blocks):
            raise ValueError(f"host_cache_bytes ({self.host_cache_bytes}) and num_host_blocks "
                             f"({self.engine.memory.num_host_blocks}) both size the host tier: give one, >= 0")
        if self.disk_cache is not None:
            self.disk  # noqa: B018  (DiskConfig refuses a capacity it cannot use)
