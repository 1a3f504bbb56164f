"""The block pool's live counters, and why an allocation could not be met: the reasons the OOM
counters count and the error a pool raises. memory_stats (memory/metrics.py) snapshots the counters
with the pool's state."""

from dataclasses import dataclass, field
from typing import Literal

OOMReason = Literal["no_free_block", "no_contiguous_block", "ref_count_lock", "zone_limit"]


class OutOfBlocks(Exception):
    """An allocation that cannot be met; the pool is unchanged.

    `reason`: ``no_contiguous_block`` when enough blocks could be freed but no run of `requested`
    consecutive ids can; ``ref_count_lock`` when the shortfall is covered by cached prefix blocks
    that are pinned by references (memory exists, references hold it); ``zone_limit`` when the kv
    zone's limit (set_zone_limits) would be passed although the pool has room; else ``no_free_block``.
    """

    def __init__(self, reason: OOMReason, requested: int, detail: str) -> None:
        super().__init__(f"{reason}: cannot allocate {requested} blocks ({detail})")
        self.reason: OOMReason = reason
        self.requested = requested


SEQ_LEN_BUCKETS = (256, 512, 1024, 2048, 4096, 8192, 16384)
"""Upper bounds (tokens) of the sequence-length buckets that OOMs are counted in; beyond: "+Inf"."""


def seq_len_bucket(seq_len: int | None) -> str:
    """Bucket label of a sequence length: the smallest bound >= it, "+Inf" beyond, "unknown" for None."""
    if seq_len is None:
        return "unknown"
    return next((str(b) for b in SEQ_LEN_BUCKETS if seq_len <= b), "+Inf")


@dataclass(slots=True)
class PoolCounters:
    """Monotonic counters a BlockPool updates as it works (mutable; snapshots copy them)."""

    evictions: int = 0
    gc_runs: int = 0
    gc_auto_runs: int = 0
    """GC passes the pool started itself because its largest free run fell under the trigger."""
    preemptions: int = 0
    swapped_to_host_bytes: int = 0
    oom_by_reason: dict[str, int] = field(default_factory=dict)
    oom_by_seq_len: dict[str, int] = field(default_factory=dict)

    def record_oom(self, reason: str, seq_len: int | None) -> None:
        self.oom_by_reason[reason] = self.oom_by_reason.get(reason, 0) + 1
        bucket = seq_len_bucket(seq_len)
        self.oom_by_seq_len[bucket] = self.oom_by_seq_len.get(bucket, 0) + 1
