"""The block pool's live counters; memory_stats (metrics.py) snapshots them with the pool's state."""

from dataclasses import dataclass, field

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
