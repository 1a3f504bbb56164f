"""Session affinity: the requests of one session (the key a caller sends in a session header) go to
the node that served the session's last request, while that node stays within the policy's load
bound (`within_load_cap` over the request's candidates); past it, or when the node is no candidate
any more, the policy decides and the session moves with the request.

The router remembers session -> node in a map bounded by `max_sessions` (the least recently routed
session is forgotten first) whose entries expire `ttl_s` after the session's last request (by then
the node's cache has moved on, and the policy knows better).
"""

import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from radixmesh.cluster.policy.base import PolicyConfig, RouteRequest, within_load_cap
from radixmesh.cluster.policy.view import ClusterView
from radixmesh.proto.ids import NodeId


@dataclass(frozen=True, slots=True)
class SessionConfig:
    """How many sessions the router remembers, and for how long."""

    max_sessions: int = 100_000
    """Sessions remembered at most; the least recently routed one is forgotten first."""
    ttl_s: float = 600.0
    """A session with no request for this long is forgotten."""

    def __post_init__(self) -> None:
        if self.max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {self.max_sessions}")
        if not (math.isfinite(self.ttl_s) and self.ttl_s > 0):
            raise ValueError(f"ttl_s must be a finite number > 0, got {self.ttl_s}")


class SessionAffinity:
    """session key -> the node its last request was routed to; use from one event loop."""

    def __init__(self, config: SessionConfig, clock: Callable[[], float]) -> None:
        self.config = config
        self._clock = clock
        # Ordered by last use, oldest first: the LRU victim and the first to expire are both at the front.
        self._nodes: OrderedDict[str, tuple[NodeId, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._nodes)

    def node(self, session: str) -> NodeId | None:
        """The node `session` was last routed to, None when it is unknown or expired."""
        self._expire()
        entry = self._nodes.get(session)
        return entry[0] if entry is not None else None

    def remember(self, session: str, node: NodeId) -> None:
        """`session`'s request was just routed to `node`."""
        self._nodes[session] = (node, self._clock())
        self._nodes.move_to_end(session)
        if len(self._nodes) > self.config.max_sessions:
            self._nodes.popitem(last=False)
        self._expire()

    def _expire(self) -> None:
        deadline = self._clock() - self.config.ttl_s
        while self._nodes:
            _, (_, used) = next(iter(self._nodes.items()))
            if used > deadline:
                return
            self._nodes.popitem(last=False)

    def check_invariants(self) -> None:
        assert len(self._nodes) <= self.config.max_sessions, f"{len(self._nodes)} sessions remembered"
        used = [t for _, t in self._nodes.values()]
        assert used == sorted(used), "sessions out of last-use order"


def within_bound(node: NodeId, view: ClusterView, request: RouteRequest, config: PolicyConfig) -> bool:
    """Whether `node`, one of `view`'s candidates, may take `request` under the policies' bounded load
    (the cap every policy applies before it weighs prefixes)."""
    allowed = within_load_cap(view.nodes, config.load_eps, request, config.load_floor_s, view.fleet)
    return any(v.node == node for v in allowed)
