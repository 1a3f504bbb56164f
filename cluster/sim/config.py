"""SimConfig: one simulated cluster, by default what `radixmesh up` runs (read from the same definitions)."""

import math
from dataclasses import asdict, dataclass

from radixmesh.cluster.metadata.service_config import ServiceConfig
from radixmesh.cluster.policy.base import PolicyConfig
from radixmesh.cluster.router.config import RouterConfig
from radixmesh.cluster.sim.trace import TRACE_BLOCK_TOKENS
from radixmesh.common.block_pool.eviction import DEFAULT_EVICTION, DEFAULT_HANDOFF, EVICTION_ORDERS
from radixmesh.common.block_pool.recall import DEFAULT_RECALL_BLOCKS

LAYOUT = "sim"
"""The one KV layout of a simulated cluster (its index partition)."""
_UP_ROUTER = RouterConfig(LAYOUT)
"""The router `radixmesh up` starts, as far as routing goes: the launcher leaves policy, candidates,
pending TTL and load settings (its PolicyConfig's) at RouterConfig's defaults, as SimConfig does."""


@dataclass(frozen=True, slots=True)
class SimConfig:
    """One simulated cluster. Its defaults are what `radixmesh up` runs, read from the same definitions
    (RouterConfig and its PolicyConfig; common.block_pool's eviction and recall for the eviction order,
    hand-off and recall; ServiceConfig for the metadata service's ghost), so `SimConfig(nodes=n,
    capacity_blocks=c)` is an `up` cluster of n nodes and `dataclasses.replace` turns parts off.

    What the simulator does not model as `up` runs it:
    - recall: the ghost is the index's own, as large as the cluster's capacity (nodes x
      capacity_blocks) and read by every node at once; `up`'s metadata service keeps
      `ServiceConfig.recall_blocks` hashes per layout (of 16-token blocks), and agents learn them with
      their next lease (a heartbeat later, at most `max_recalled_per_lease` a lease) into a window of
      `AgentConfig.recall_blocks`.
    - hand-off: a pull always delivers here; an agent demotes only after every chunk was sent.
    - routing: the index is exact and instant (a node's blocks are indexed when its prefill ends);
      `up`'s router routes on a replica fed by the metadata stream (the agent publishes every 50 ms,
      the replica lags a few ms more: the pending hold's `pending_ttl_s` after the first token covers
      it) and asks Match while it is out of sync, which scores every node, not `candidates`.
      Load is the nodes' queues and the configured prefill rate, not heartbeats; decode, admission
      limits and the agents' request cap are not modelled.
    - hardware: prefill rate, KV bytes and pull bandwidth/latency are this model's (an 8B model on a
      datacenter link), priced as if measured; `up`'s router prices PolicyConfig's defaults until
      its agents report measured ones. A trace block is 512 tokens, an agent's 16 by default.
    - tiers: a node is one gpu-tier cache, as `up`'s agents are by default (host_blocks 0), unless
      host_blocks / disk_blocks give it LRU victim tiers (`node.SecondChance`): blocks the gpu
      evicts, read back at the tier's bandwidth. A hit moves a block out of its tier (`up`'s host
      keeps a copy), and a read is not overlapped with the pull or the prefill. The index learns
      every tier move as a cache event on Tier.HOST / Tier.DISK, so the routers see a node's host
      and disk prefix as `up`'s do (NodeMatch.host_blocks, any_tier_blocks); `up`'s agents publish
      their disk tier only in snapshots, the simulator's every change at once. Pulls read a peer's
      gpu only, as `up`'s transfer source does, and the views count only a peer's gpu prefix as
      pullable. The oracles (global LRU) keep the gpu-only capacity.
    """

    nodes: int
    capacity_blocks: int
    """Cache capacity of each node, in trace blocks."""
    policy: str = _UP_ROUTER.policy
    """Routing policy (RouterConfig.policy)."""
    prefill_tokens_per_s: float = 20_000.0
    """Every node's prefill rate (an 8B model on one H100-class GPU, roughly)."""
    kv_bytes_per_token: int = 128 * 1024
    """KV bytes per token (Llama-3-8B: 32 layers x 8 KV heads x 128 dims x K,V x bf16)."""
    pull_bytes_per_s: float = 10e9
    """Pull bandwidth between any two nodes (a datacenter link, not loopback); the simulated routers
    price pulls with it as if every pair had measured it."""
    pull_latency_s: float = 0.002
    """Fixed cost of one pull, likewise."""
    load_eps: float = _UP_ROUTER.policy_config.load_eps
    """Bounded load's slack (PolicyConfig.load_eps)."""
    load_floor_s: float = _UP_ROUTER.policy_config.load_floor_s
    """Recent work below this many seconds of prefill is not load (PolicyConfig.load_floor_s)."""
    load_half_life_s: float = _UP_ROUTER.policy_config.load_half_life_s
    """Half-life of the recent-work load measure (PolicyConfig.load_half_life_s)."""
    pending_ttl_s: float = _UP_ROUTER.pending_ttl_s
    """How long a routed request's blocks still count as held by its node after its prefill ended
    (RouterConfig.pending_ttl_s); until then they count however long it waits, up to pending_max_s."""
    pending_max_s: float = _UP_ROUTER.pending_max_s
    """The bound on a pending hold whose request has not answered (RouterConfig.pending_max_s)."""
    eviction: str = DEFAULT_EVICTION
    """Each node's eviction order (`PoolConfig.eviction`, a name in EVICTION_ORDERS; the agents'
    default, so a simulated node evicts as a real one does); the global reference cache of the same
    name runs beside it (`SimReport.global_same_eviction`)."""
    cluster_eviction: bool = False
    """Replicated chain ends first among the next `eviction_window` blocks of each eviction
    (PoolHooks.copies_elsewhere, holder counts from the cluster's events). Off, as in `up`: agents
    build their pools without copies_elsewhere and no setting gives them one; only the simulator
    runs it."""
    eviction_window: int = 64
    """Blocks past the eviction order's next one that cluster eviction may pick from (simulator only)."""
    handoff: bool = DEFAULT_HANDOFF
    """A pull's source demotes the blocks it sent that the puller lacked (BlockPool.demote): the
    puller's copy serves the conversation from now on, the source's goes first when space is needed
    (AgentConfig.handoff)."""
    cluster_recall: bool = DEFAULT_RECALL_BLOCKS > 0 and ServiceConfig().recall_blocks > 0
    """Nodes learn which blocks the cluster evicted its last copy of, recently (the index's ghost,
    `GlobalIndex.recalled`, as long as the cluster has blocks), and keep such blocks as re-used when
    they come back (PoolHooks.recalled; used by ``s3fifo`` and ``adaptive``). On in `up` while both the metadata
    service's and the agents' ghost have room (ServiceConfig / AgentConfig.recall_blocks)."""
    seed: int = 0
    candidates: int = _UP_ROUTER.least_loaded_candidates if _UP_ROUTER.index_replica else 0
    """0: the policy scores every node. k > 0: only the prefix holders (indexed or pending) and the
    k least-loaded nodes, with bounded load against the fleet's mean, as the router does on its
    index replica (RouterConfig.least_loaded_candidates)."""
    routers: int = 1
    """Routers behind a round-robin balancer (request i to router i mod routers); `up` starts one.
    They share the index (each holds an in-sync replica) but not what only a router knows: its
    pending (speculative) holders, its recent-work load table and its policy state. Node queues stay
    the nodes' truth."""
    shared_pending: bool = False
    """Routers share one PendingIndex (as if speculative inserts went through the metadata stream
    with no lag): measures what not sharing them costs."""
    host_blocks: int = 0
    """Each node's host tier, in trace blocks (0: none, as `up` runs by default)."""
    disk_blocks: int = 0
    """Each node's disk tier, in trace blocks, under the host tier (0: none, as `up` runs by default)."""
    host_bytes_per_s: float = 25e9
    """Host-to-gpu read bandwidth (PCIe Gen5 x16, roughly); the simulated routers price host reads
    with it as if the nodes had measured it."""
    disk_bytes_per_s: float = 5e9
    """Disk-to-gpu read bandwidth through the host (one NVMe SSD, roughly); priced likewise."""
    check_every: int = 0
    """Run every node's and the index's check_invariants() every this many arrivals (0: never)."""

    def __post_init__(self) -> None:
        if self.routers < 1:
            raise ValueError(f"routers must be >= 1, got {self.routers}")
        if self.nodes < 1 or self.capacity_blocks < 1:
            raise ValueError(
                f"nodes and capacity_blocks must be >= 1, got {self.nodes}, {self.capacity_blocks}"
            )
        if not (math.isfinite(self.prefill_tokens_per_s) and self.prefill_tokens_per_s > 0):
            raise ValueError("prefill_tokens_per_s must be a finite number > 0")
        if self.eviction not in EVICTION_ORDERS:
            raise ValueError(f"eviction must be one of {sorted(EVICTION_ORDERS)}, got {self.eviction!r}")
        if self.kv_bytes_per_token < 0 or not self.pull_bytes_per_s > 0 or self.check_every < 0:
            raise ValueError("kv_bytes_per_token and check_every must be >= 0, pull_bytes_per_s > 0")
        if self.candidates < 0 or self.eviction_window < 0:
            raise ValueError(f"candidates and eviction_window must be >= 0, got {self.candidates}, "
                             f"{self.eviction_window}")
        if self.host_blocks < 0 or self.disk_blocks < 0:
            raise ValueError(f"host_blocks and disk_blocks must be >= 0, got {self.host_blocks}, {self.disk_blocks}")
        if not all(math.isfinite(b) and b > 0 for b in (self.host_bytes_per_s, self.disk_bytes_per_s)):
            raise ValueError(f"host_bytes_per_s and disk_bytes_per_s must be finite numbers > 0, got "
                             f"{self.host_bytes_per_s}, {self.disk_bytes_per_s}")
        for name, seconds in (("pending_ttl_s", self.pending_ttl_s), ("pending_max_s", self.pending_max_s)):
            if not (math.isfinite(seconds) and seconds > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {seconds}")
        self.policy_config  # noqa: B018  (building it validates the load settings)

    @property
    def block_bytes(self) -> int:
        return TRACE_BLOCK_TOKENS * self.kv_bytes_per_token

    @property
    def policy_config(self) -> PolicyConfig:
        """The simulated routers' policy settings: load as configured, pulls and tier reads priced as
        they run."""
        return PolicyConfig(
            load_eps=self.load_eps,
            load_floor_s=self.load_floor_s,
            load_half_life_s=self.load_half_life_s,
            block_bytes=self.block_bytes,
            host_bytes_per_s=self.host_bytes_per_s,
            disk_bytes_per_s=self.disk_bytes_per_s,
            pull_latency_s=self.pull_latency_s,
            pull_bytes_per_s=self.pull_bytes_per_s,
        )

    def as_dict(self) -> dict[str, object]:
        """Every setting by field name (JSON-ready: the report's `config`)."""
        return asdict(self)
