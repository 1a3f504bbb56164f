"""Why an allocation could not be met: the reasons the OOM metrics count, and the error a pool raises."""

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
