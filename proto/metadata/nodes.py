"""What a node declares when it registers, what it heartbeats, and the lease it gets back."""

from dataclasses import dataclass, field

from radixmesh.proto.ids import NodeId


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """What a node declares when it registers; fixed for one epoch."""

    node_id: NodeId
    epoch: int
    """Incarnation number, >= 1, strictly higher after every restart."""
    layout: str
    """KVLayout fingerprint."""
    block_size: int
    """Tokens per block of that layout."""
    block_bytes: int
    """KV bytes of one block of that layout (KVLayout.block_bytes): what the router prices a pull by."""
    transfer_address: str
    capacity_blocks: int

    def __post_init__(self) -> None:
        if not self.node_id:
            raise ValueError("node_id must be non-empty")
        if self.epoch < 1:
            raise ValueError(f"epoch must be >= 1, got {self.epoch}")
        if not self.layout:
            raise ValueError("layout fingerprint must be non-empty")
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if self.block_bytes < 1:
            raise ValueError(f"block_bytes must be >= 1, got {self.block_bytes}")
        if self.capacity_blocks < 0:
            raise ValueError(f"capacity_blocks must be >= 0, got {self.capacity_blocks}")


@dataclass(frozen=True, slots=True)
class NodeLoad:
    """A node's load as of its last heartbeat."""

    queued_requests: int = 0
    running_tokens: int = 0
    free_blocks: int = 0
    prefill_tokens_per_s: float = 0.0
    pull_gbps: dict[str, float] = field(default_factory=dict)
    """Measured pull bandwidth by peer node id, GB/s."""

    def __post_init__(self) -> None:
        counts = (self.queued_requests, self.running_tokens, self.free_blocks, self.prefill_tokens_per_s)
        if min(counts) < 0 or any(v < 0 for v in self.pull_gbps.values()):
            raise ValueError("load figures must be non-negative")


@dataclass(frozen=True, slots=True)
class Lease:
    node_id: NodeId
    epoch: int
    ttl_s: float
    next_seq: int
    snapshot_required: bool
