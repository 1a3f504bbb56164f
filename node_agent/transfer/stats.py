"""Per-peer transfer statistics: the inputs of the router's pull-cost model.

The router prices a pull of B bytes from peer p as ``ewma_latency_s + B / (ewma_gbps * 1e9)``: a
fixed cost (channel, request round trip, the puller's allocation on its engine thread) and a
payload rate, both decayed averages of this agent's own pulls (EWMAs: the newest pull weighs
`alpha`), heartbeated with the agent's load. The two are measured apart so a pull of a few blocks is
not priced at the bandwidth of a large one, nor a large one at the handshake of a small one.
Rendered to Prometheus by the agent (agent_metrics) as radixmesh_pull_bytes_total,
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
    """Payload bytes per second after the first byte (1e9 bytes/s), 0 until one pull moved bytes."""
    ewma_latency_s: float = 0.0
    """Fixed cost of a pull: its start to the owner's header, 0 until one pull was recorded. A pull
    that never got a header counts its whole time (it cost at least that before any byte)."""
    outcomes: dict[str, int] = field(default_factory=dict)
    priced_pulls: int = 0
    """Of `pulls`, those folded into the averages."""

    def record(self, outcome: str, blocks: int, nbytes: int, seconds: float, latency_s: float, *,
               priced: bool = True) -> None:
        """Account one finished pull (successful or not); `latency_s` 0 means no header arrived.
        `priced` False: count it in the totals only (a followed hand-off, whose time is mostly the
        owner computing the blocks: in the averages it would price every later pull from that peer)."""
        self.pulls += 1
        self.blocks += blocks
        self.bytes += nbytes
        self.seconds += seconds
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        if not priced:
            return
        first = self.priced_pulls == 0
        self.priced_pulls += 1
        fixed = latency_s if latency_s > 0 else seconds
        self.ewma_latency_s = fixed if first else self._mix(self.ewma_latency_s, fixed)
        payload_s = seconds - latency_s
        if nbytes and payload_s > 0:
            gbps = nbytes / payload_s / 1e9
            self.ewma_gbps = gbps if self.ewma_gbps == 0.0 else self._mix(self.ewma_gbps, gbps)

    def _mix(self, old: float, new: float) -> float:
        return (1.0 - self.alpha) * old + self.alpha * new
