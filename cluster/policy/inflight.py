"""The router's own load table: requests it routed and not finished, prompt tokens not yet
prefilled, pulls not yet done, requests decoding, and recent work, per node. It changes the moment
the router routes, while a heartbeat is seconds old, and bounded load must hold for the burst in
between."""

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from radixmesh.cluster.policy.recent_work import DEFAULT_HALF_LIFE_S, RecentWork
from radixmesh.proto.ids import NodeId


@dataclass(slots=True)
class Ticket:
    """One request the router has sent to `node`; `queued_tokens` count until its prefill ends."""

    node: NodeId
    queued_tokens: int
    pull_s: float = 0.0
    """Estimated seconds of its planned pull, counted (as `queued_tokens`) until its prefill ends."""
    prefilled: bool = False
    finished: bool = False
    prefilled_at: float = 0.0
    """When its first token arrived (the table's clock): its decode time is measured from here."""


DECODE_WEIGHT = 0.1
"""Weight of one finished request in a node's mean decode time: about the last ten requests count, so
the mean follows a node whose batch grows within a few seconds of traffic."""


class InflightTable:
    """Per node: requests routed and not finished, prompt tokens routed and not yet prefilled, their
    planned pull seconds, requests prefilled and not finished (decoding), how long a request decodes
    there (first token to finish, a moving mean over the requests that finished), and recent work
    (prompt tokens routed, decayed with `half_life_s` on `clock`; see RecentWork).

    Every `start` is matched by one `finish` (which implies `prefilled`); both are idempotent per
    ticket, so a retry path that finishes twice cannot drive a count negative.
    """

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, half_life_s: float = DEFAULT_HALF_LIFE_S
    ) -> None:
        self._clock = clock
        self._recent = RecentWork(half_life_s, clock)
        self._decode_s: dict[NodeId, float] = {}
        self._inflight: dict[NodeId, int] = {}
        self._queued: dict[NodeId, int] = {}
        self._pulls: dict[NodeId, list[Ticket]] = {}
        """Open tickets with a planned pull, not yet prefilled (few: summed when read, no float drift)."""
        self._decoding: dict[NodeId, int] = {}
        self._open: list[Ticket] = []

    def start(self, node: NodeId, queued_tokens: int, pull_s: float = 0.0) -> Ticket:
        """`node` was sent a request that prefills `queued_tokens` after a pull of about `pull_s`."""
        if queued_tokens < 0 or not (math.isfinite(pull_s) and pull_s >= 0):
            raise ValueError(f"queued_tokens and pull_s must be >= 0, got {queued_tokens}, {pull_s}")
        ticket = Ticket(node, queued_tokens, pull_s)
        self._inflight[node] = self._inflight.get(node, 0) + 1
        self._queued[node] = self._queued.get(node, 0) + queued_tokens
        if pull_s > 0:
            self._pulls.setdefault(node, []).append(ticket)
        self._open.append(ticket)
        return ticket

    def prefilled(self, ticket: Ticket) -> None:
        """The request's first token arrived: its prompt and pull no longer wait on the node; it decodes."""
        if not ticket.prefilled:
            ticket.prefilled = True
            ticket.prefilled_at = self._clock()
            self._queued[ticket.node] -= ticket.queued_tokens
            if ticket.pull_s > 0:
                pulls = self._pulls[ticket.node]
                pulls.remove(ticket)
                if not pulls:
                    del self._pulls[ticket.node]
            if not ticket.finished:
                self._decoding[ticket.node] = self._decoding.get(ticket.node, 0) + 1

    def finish(self, ticket: Ticket) -> None:
        if ticket.finished:
            return
        decoding = ticket.prefilled
        self.prefilled(ticket)
        ticket.finished = True
        if decoding:  # a request that failed before its first token measured no decode
            took = max(0.0, self._clock() - ticket.prefilled_at)
            mean = self._decode_s.get(ticket.node)
            self._decode_s[ticket.node] = took if mean is None else mean + DECODE_WEIGHT * (took - mean)
        self._inflight[ticket.node] -= 1
        self._decoding[ticket.node] -= 1
        self._open.remove(ticket)

    def record_routed(self, node: NodeId, tokens: int) -> None:
        """`node` was sent a request whose prefill computes `tokens` there (each attempt counts: each
        is work there). Its prompt's reused part is not work: counted, a node that served a burst of
        cached prompts (a restarted agent reading its disk) reached the load cap, whose floor is half
        a second of prefill, on a few tokens' computing, and its next requests went to a node that
        recomputed them."""
        self._recent.add(node, tokens)

    def forget_recent(self, node: NodeId) -> None:
        """`node` left the cluster: its recent work and decode time no longer count (RecentWork.forget)."""
        self._recent.forget(node)
        self._decode_s.pop(node, None)

    def recent_tokens(self, node: NodeId) -> float:
        return self._recent.value(node)

    def total_recent_tokens(self) -> float:
        return self._recent.total()

    def least_loaded(self, k: int, pool: Sequence[NodeId], usable: Callable[[NodeId], bool]) -> list[NodeId]:
        """Up to `k` nodes of `pool` with the least recent work (see RecentWork.least)."""
        return self._recent.least(k, pool, usable)

    def inflight(self, node: NodeId) -> int:
        return self._inflight.get(node, 0)

    def queued_tokens(self, node: NodeId) -> int:
        return self._queued.get(node, 0)

    def running_decodes(self, node: NodeId) -> int:
        return self._decoding.get(node, 0)

    def pulling_s(self, node: NodeId) -> float:
        return sum((t.pull_s for t in self._pulls.get(node, ())), 0.0)

    def decode_s(self, node: NodeId) -> float:
        """Mean seconds a request decoded on `node` after its first token (0: none finished there yet)."""
        return self._decode_s.get(node, 0.0)

    def check_invariants(self) -> None:
        """Counts equal the open tickets' sums; nothing is negative."""
        self._recent.check_invariants()
        for node in set(self._inflight) | set(self._queued) | set(self._pulls) | set(self._decoding):
            mine = [t for t in self._open if t.node == node]
            queued = sum(t.queued_tokens for t in mine if not t.prefilled)
            decoding = sum(1 for t in mine if t.prefilled)
            pulls = [t for t in mine if t.pull_s > 0 and not t.prefilled]
            assert self.inflight(node) == len(mine), f"{node}: inflight {self.inflight(node)} != {len(mine)}"
            assert self.queued_tokens(node) == queued, f"{node}: queued {self.queued_tokens(node)} != {queued}"
            running = self.running_decodes(node)
            assert running == decoding, f"{node}: decoding {running} != {decoding}"
            counted = sorted(t.pull_s for t in self._pulls.get(node, []))
            assert counted == sorted(t.pull_s for t in pulls), f"{node}: pulls {counted} drifted"
