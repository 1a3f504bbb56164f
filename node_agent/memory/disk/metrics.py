"""The disk tier's metrics: one frozen snapshot, rendered by common.metrics.exposition like the
memory tiers' (labelled tier="disk"). Bandwidths are counters of bytes and of the seconds spent
moving them: rate(bytes) / rate(seconds) over any window is the bandwidth while busy."""

# metric() returns a dataclasses.field (metadata only), which RUF009 takes for a mutable default.
# ruff: noqa: RUF009

from dataclasses import dataclass

from radixmesh.common.metrics.exposition import metric


@dataclass(frozen=True, slots=True)
class DiskStats:
    """Every metric of one disk tier, at one instant."""

    tier: str
    disk_bytes: int = metric("gauge", "Bytes of KV records in the disk tier's segment files.")
    disk_capacity_bytes: int = metric("gauge", "Bound on the disk tier's segment files.")
    disk_blocks: int = metric("gauge", "Blocks the disk tier can serve.")
    disk_reads: int = metric("counter", "Blocks read back from disk (verified).")
    disk_read_bytes: int = metric("counter", "KV bytes read back from disk.")
    disk_read_seconds: float = metric("counter", "Seconds spent reading and verifying disk blocks.")
    disk_writes: int = metric("counter", "Blocks written to disk.")
    disk_write_bytes: int = metric("counter", "KV bytes written to disk.")
    disk_write_seconds: float = metric("counter", "Seconds the writer thread spent in writes.")
    disk_evictions: int = metric("counter", "Blocks the disk tier dropped to stay within its capacity.")
    disk_dropped_blocks: dict[str, int] = metric(
        "counter", "Records found unfit and never served, by reason (torn, corrupt, foreign).", "reason")
    disk_offers_dropped: int = metric("counter", "Blocks not written because the writer was behind.")
    disk_write_errors: int = metric("counter", "Blocks whose write failed (disk full or failing).")
    disk_skipped_files: int = metric(
        "gauge", "Entries of the disk tier's directory that are not its segment files (FIFOs, links, other "
        "names), found at start: skipped, never read or deleted.")

