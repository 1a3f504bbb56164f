"""What the metadata service accepts: its settings, its limits, and the checks that enforce them.

A node holds at most its declared `capacity_blocks` (0: undeclared, the snapshot limit) plus
`capacity_slack_blocks` in the index: a batch or snapshot that would take it past that is refused
whole (LimitExceeded, RESOURCE_EXHAUSTED on the wire).
"""

from collections.abc import Sequence
from dataclasses import dataclass, field

from radixmesh.common.block_pool.recall import DEFAULT_RECALL_BLOCKS
from radixmesh.proto.block_hash import HASH_BYTES
from radixmesh.proto.metadata.limits import MAX_HASHES_PER_QUERY, MAX_HITS_PER_HEARTBEAT

_WRONG_HASH_LENGTH = HASH_BYTES.__ne__


class LimitExceeded(ValueError):
    """A request is well-formed but larger than the service accepts."""


@dataclass(frozen=True, slots=True)
class ServiceLimits:
    max_hashes_per_query: int = MAX_HASHES_PER_QUERY
    max_queries_per_request: int = 256
    max_blocks_per_batch: int = 16384
    """Hashes across all events of one EventBatch."""
    max_snapshot_blocks: int = 1 << 20
    """Hashes across the chains of one NodeSnapshot; also what a node that declares no capacity
    (capacity_blocks 0) may hold."""
    capacity_slack_blocks: int = 512
    """Blocks a node may hold beyond its declared capacity_blocks: a node that publishes a request's
    new blocks before the evictions they caused may be that far over between two batches (one long
    prompt's worth; bench/metadata.py's trace peaks 240 over). An agent evicts before it stores, so
    it needs none. A margin, not a second budget."""
    max_hits_per_heartbeat: int = MAX_HITS_PER_HEARTBEAT
    max_predictions_per_report: int = 4096
    max_epoch_ahead_s: float = 300.0
    """Epochs are microseconds of wall time (agent.new_epoch); one further ahead of the service's
    clock than this is refused, so no caller can fence a node name off for good with a huge epoch."""


@dataclass(frozen=True, slots=True)
class ServiceConfig:
    lease_ttl_s: float = 10.0
    """A node vanishes this long after its last register/heartbeat."""
    max_predictions: int = 8192
    """Match predictions kept for hit accounting (newest request ids). A prediction waits only for its
    request's hits in the serving node's next heartbeat, so this bounds requests in flight across the
    routers, not history; with one live node per entry it stays near 30 bytes a prediction per node."""
    limits: ServiceLimits = field(default_factory=ServiceLimits)
    watch_backlog: int = 65536
    """Updates queued per WatchIndex stream; a watcher further behind is sent a fresh snapshot."""
    recall_blocks: int = DEFAULT_RECALL_BLOCKS
    """Last-copy evictions the index remembers per layout (the cluster's ghost, GlobalIndex.recalled;
    about 10 MB at the default); 0 turns the ghost off. In the simulator a ghost as large as the
    cluster's capacity moved synthetic-8 from 0.927 to 1.025 x global LRU (s3fifo alone vs with the ghost, docs/benchmarks.md)."""
    max_recalled_per_lease: int = 8192
    """Ghost entries one heartbeat's lease carries at most (the newest), 128 KiB of hashes."""


def check_limit(what: str, n: int, limit: int) -> None:
    if n > limit:
        raise LimitExceeded(f"{what}: {n} > limit {limit}")


def check_hashes(hashes: Sequence[bytes]) -> None:
    # In C: this runs over every hash of every Match and event batch.
    if any(map(_WRONG_HASH_LENGTH, map(len, hashes))):
        bad = next(n for n in map(len, hashes) if n != HASH_BYTES)
        raise ValueError(f"block hashes are {HASH_BYTES} bytes, got one of {bad}")
