"""What a node declares when it registers, what it heartbeats, and the lease it gets back."""

import math
from dataclasses import dataclass, field

from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.ids import NodeId
from radixmesh.proto.metadata.limits import (
    MAX_ADDRESS_CHARS,
    MAX_LAYOUT_CHARS,
    MAX_PEERS_PER_LOAD,
    check_node_id,
    check_text,
)

MAX_BLOCK_SIZE = 1 << 16
"""Tokens per block, at most (a block is a unit of sharing: far smaller in practice)."""
MAX_BLOCK_BYTES = 1 << 34
MAX_CAPACITY_BLOCKS = 1 << 40
MAX_LOAD_COUNT = 1 << 53
"""Load counters above this are not counts of anything real (and lose precision as floats)."""
MAX_GROUP_CHARS = 256
"""A compute group name (host, device and core set of an agent)."""

NODE_ROLES = ("both", "prefill", "decode")
"""What a node serves (prefill/decode disaggregation, docs/disaggregation.md): `both` prefills and
decodes its own requests (the default, an aggregated cluster); a `prefill` node computes prompts whose
KV a `decode` node pulls and generates from. Every node can still do either: a role is where the
router sends which phase."""


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
    role: str = "both"
    """One of NODE_ROLES."""

    def __post_init__(self) -> None:
        check_node_id(self.node_id)
        if self.role not in NODE_ROLES:
            raise ValueError(f"role must be one of {', '.join(NODE_ROLES)}, got {self.role!r}")
        if self.epoch < 1:
            raise ValueError(f"epoch must be >= 1, got {self.epoch}")
        if not self.layout:
            raise ValueError("layout fingerprint must be non-empty")
        check_text("layout fingerprint", self.layout, MAX_LAYOUT_CHARS)
        check_text("transfer address", self.transfer_address, MAX_ADDRESS_CHARS)
        if not 1 <= self.block_size <= MAX_BLOCK_SIZE:
            raise ValueError(f"block_size must be in [1, {MAX_BLOCK_SIZE}], got {self.block_size}")
        if not 1 <= self.block_bytes <= MAX_BLOCK_BYTES:
            raise ValueError(f"block_bytes must be in [1, {MAX_BLOCK_BYTES}], got {self.block_bytes}")
        if not 0 <= self.capacity_blocks <= MAX_CAPACITY_BLOCKS:
            raise ValueError(f"capacity_blocks must be in [0, {MAX_CAPACITY_BLOCKS}], got {self.capacity_blocks}")


@dataclass(frozen=True, slots=True)
class NodeLoad:
    """A node's load as of its last heartbeat, and the prices it measured (what the router's cost
    model reads: prefill rate, and per peer what a pull costs, as fixed cost + bytes / bandwidth)."""

    queued_requests: int = 0
    running_tokens: int = 0
    free_blocks: int = 0
    prefill_tokens_per_s: float = 0.0
    pull_gbps: dict[str, float] = field(default_factory=dict)
    """Measured pull payload bandwidth by peer node id, GB/s (the fixed cost excluded)."""
    pull_latency_s: dict[str, float] = field(default_factory=dict)
    """Measured fixed cost of one pull by peer node id, seconds: request to the first byte."""
    compute_group: str = ""
    """Agents that report the same non-empty group share their cores (or accelerator); "" shares
    with nobody."""
    disk_read_gbps: float = 0.0
    """Measured read rate of the node's disk tier, GB/s, verification included (0: none measured)."""
    step_floor_s: float = 0.0
    """Measured seconds of an engine step that decodes only, what every step costs before its prefill
    tokens (0: none measured); `prefill_tokens_per_s` is then the rate beyond it."""
    compute_share: float = 0.0
    """The share of its compute group's cores the engine computes on, in [0, 1] (its threads over its
    cores; 1 on an accelerator): mates whose busy shares add up to no more than 1 do not slow each
    other. 0: unknown, priced as using the whole group."""

    def __post_init__(self) -> None:
        # NaN compares false with everything: `not 0 <= x` (not `x < 0`) is what refuses it.
        figures = (self.queued_requests, self.running_tokens, self.free_blocks, self.prefill_tokens_per_s,
                   self.disk_read_gbps, self.step_floor_s, *self.pull_gbps.values(), *self.pull_latency_s.values())
        if not all(math.isfinite(v) and 0 <= v <= MAX_LOAD_COUNT for v in figures):
            raise ValueError(f"load figures must be finite numbers in [0, 2^53], got {figures[:9]}")
        for what, peers in (("bandwidth", self.pull_gbps), ("fixed cost", self.pull_latency_s)):
            if len(peers) > MAX_PEERS_PER_LOAD:
                raise ValueError(f"pull {what} of at most {MAX_PEERS_PER_LOAD} peers, got {len(peers)}")
            for peer in peers:
                check_node_id(peer)
        check_text("compute group", self.compute_group, MAX_GROUP_CHARS)
        if not 0 <= self.compute_share <= 1:  # NaN fails too
            raise ValueError(f"compute_share must be in [0, 1], got {self.compute_share}")


@dataclass(frozen=True, slots=True)
class Lease:
    node_id: NodeId
    epoch: int
    ttl_s: float
    next_seq: int
    snapshot_required: bool
    recalled: tuple[BlockHash, ...] = ()
    """Blocks the cluster evicted its last copy of since the node's previous heartbeat (the index's
    ghost, oldest first): stored again here, they count as re-used (PoolHooks.recalled)."""
