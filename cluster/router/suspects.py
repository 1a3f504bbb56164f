"""Nodes the router does not route new requests to because an attempt there just failed.

An agent that dies stays in the index until its lease ends (10 s by default) and in the agent
directory until the launcher notices; until then every request whose prefix it held would be routed
there, fail and be retried: a wasted attempt each, or a whole connect timeout on a partition. So a
node whose attempt fails (AgentUnavailable) is set aside for `hold_s`, or until the index stream
shows it registered afresh (a restarted agent; not a load report, which may have been sent just
before the agent died). Busy agents
(AgentBusy) are not suspects: they answered. When every candidate is a suspect, the router tries
them anyway (a lone agent's transient fault must not refuse every request for `hold_s`).
"""

from collections.abc import Callable

from radixmesh.proto.ids import NodeId

DEFAULT_HOLD_S = 30.0
"""Longer than a lease (10 s by default): a dead agent has left the index before it is tried again."""


class Suspects:
    """node -> until when it is set aside; use from one event loop."""

    def __init__(self, clock: Callable[[], float], hold_s: float = DEFAULT_HOLD_S) -> None:
        self._clock, self.hold_s = clock, hold_s
        self._until: dict[NodeId, float] = {}

    def failed(self, node: NodeId) -> None:
        self._until[node] = self._clock() + self.hold_s

    def seen_alive(self, node: NodeId) -> None:
        self._until.pop(node, None)

    def current(self) -> frozenset[NodeId]:
        """The nodes set aside now (expired ones are forgotten)."""
        now = self._clock()
        for node in [n for n, until in self._until.items() if until <= now]:
            del self._until[node]
        return frozenset(self._until)
