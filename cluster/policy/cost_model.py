"""Estimated time to first token of a request on one node, the quantity the `cost` policy minimises.

    TTFT = queue delay + host swap-in of the local prefix's host part
           + pull of the blocks a peer holds beyond the local prefix (only when cheaper than recomputing them)
           + prefill of the rest

Block ranges of the prompt, for a candidate with local prefix L and a peer holding H > L::

    [0, L)  local (gpu, then host)   [L, H)  pulled from the peer   [H, n)  prefilled (+ the partial tail)
"""

from typing import NamedTuple

from radixmesh.cluster.policy.base import PolicyConfig, RouteRequest
from radixmesh.cluster.policy.view import NodeView
from radixmesh.proto.ids import NodeId


class Holder(NamedTuple):
    """A peer that holds blocks 0..blocks-1 of the prompt, and our measured pull rate from it."""

    node: NodeId
    blocks: int
    bytes_per_s: float


class TTFTEstimate(NamedTuple):
    total_s: float
    queue_s: float
    swap_s: float
    pull_s: float
    prefill_s: float
    pull_blocks: int
    """0 when no peer holds more, or pulling them is not cheaper than recomputing."""


class CostModel:
    """Linear time model: prefill and copies cost per token/byte at the node's measured rates."""

    def __init__(self, config: PolicyConfig) -> None:
        self.config = config

    def pull_time(self, blocks: int, bytes_per_s: float) -> float:
        """Seconds to pull `blocks` blocks in one transfer (0 for none)."""
        if blocks <= 0:
            return 0.0
        return self.config.pull_latency_s + blocks * self.config.block_bytes / bytes_per_s

    def estimate(self, request: RouteRequest, view: NodeView, holder: Holder | None) -> TTFTEstimate:
        """TTFT of `request` on `view`'s node, pulling from `holder` when that pays."""
        rate = view.prefill_tokens_per_s
        queue_s = view.queued_tokens / rate
        local = min(view.local_blocks, request.num_blocks)
        swap_s = (
            (local - min(view.gpu_blocks, local)) * self.config.block_bytes / self.config.host_bytes_per_s
        )
        pull_blocks, pull_s = 0, 0.0
        if holder is not None and holder.blocks > local:
            k = min(holder.blocks, request.num_blocks) - local
            t = self.pull_time(k, holder.bytes_per_s)
            # Pull only when it beats recomputing the same tokens here.
            if t < k * request.block_tokens / rate:
                pull_blocks, pull_s = k, t
        prefill_s = (request.prompt_tokens - (local + pull_blocks) * request.block_tokens) / rate
        total = queue_s + swap_s + pull_s + prefill_s
        return TTFTEstimate(total, queue_s, swap_s, pull_s, prefill_s, pull_blocks)
