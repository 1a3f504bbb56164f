"""Per-peer transfer statistics: the inputs of the router's pull-cost model.

The router estimates a pull of B bytes from peer p as ``latency_s + B / (gbps * 1e9)``, both EWMAs
of observed pulls. Rendered to Prometheus by the agent (agent_metrics) as radixmesh_pull_bytes_total,
radixmesh_pull_seconds_total, radixmesh_pulls_total{outcome}, per peer.
"""

from dataclasses import dataclass, field


@dataclass(slots=True)
class PeerStats:
    """Totals and EWMAs of the pulls from one peer over one transport."""

    transport: str
    alpha: float = 0.2
    """Weight of the newest observation in the EWMAs."""
    pulls: int = 0
    blocks: int = 0
    bytes: int = 0
    seconds: float = 0.0
    ewma_gbps: float = 0.0
    """Payload bytes per second of a pull (1e9 bytes/s), 0 until one pull moved bytes."""
    ewma_latency_s: float = 0.0
    """Request to header: what a pull costs before its first byte."""
    outcomes: dict[str, int] = field(default_factory=dict)

    def record(self, outcome: str, blocks: int, nbytes: int, seconds: float, latency_s: float) -> None:
        """Account one finished pull (successful or not)."""
        first = self.pulls == 0
        self.pulls += 1
        self.blocks += blocks
        self.bytes += nbytes
        self.seconds += seconds
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        self.ewma_latency_s = latency_s if first else self._mix(self.ewma_latency_s, latency_s)
        if nbytes and seconds > 0:
            gbps = nbytes / seconds / 1e9
            self.ewma_gbps = gbps if self.ewma_gbps == 0.0 else self._mix(self.ewma_gbps, gbps)

    def _mix(self, old: float, new: float) -> float:
        return (1.0 - self.alpha) * old + self.alpha * new
