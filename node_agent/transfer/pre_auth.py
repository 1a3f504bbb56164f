"""Connections that have not authenticated yet: what anyone who reaches a transfer port costs, and who
keeps a slot when they are full.

Caps alone (per source, in all) let a few source addresses lock everyone else out: under `up --local`
every agent connects from 127.0.0.1, and 127.0.0.2-5 are loopback too, so four silent sources of 16
filled the 64 and 1-4 of 20 honest handshakes got through (issue 38, item 15). So a newcomer is never
refused for these caps; it takes a slot from whoever holds most:

    its source is at per_source  ->  that source's oldest connection is closed
    all `total` slots are taken  ->  the oldest connection of the source holding most is closed

An honest handshake takes a round trip and finishes in milliseconds; a flood's connections are the
ones that sit, so they are the oldest and go first, and a source with few connections (an honest
agent) is never the one that holds most while a flood is on.
"""

import itertools
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PreAuthLimits:
    """Bounds on connections that have not authenticated yet."""

    first_byte_timeout_s: float = 1.0
    """An honest requester's HELLO leaves with its connection; a socket that sends no frame head this
    long is closed (the rest of the handshake still has handshake_timeout_s)."""
    per_source: int = 16
    """Unauthenticated connections from one address at once; a newer one closes the oldest. Agents of
    one host handshake with an owner one connection each, rarely at the same moment."""
    total: int = 64
    """Unauthenticated connections at once, from all addresses; less than max_connections."""

    def __post_init__(self) -> None:
        if self.first_byte_timeout_s <= 0 or not 1 <= self.per_source <= self.total:
            raise ValueError(f"first_byte_timeout_s must be positive and 1 <= per_source <= total, got {self}")


class PreAuthSlots:
    """The unauthenticated connections, by source, oldest first. Use from one event loop."""

    def __init__(self, limits: PreAuthLimits) -> None:
        self.limits = limits
        self._by_source: dict[str, OrderedDict[int, Callable[[], None]]] = {}
        self._tickets = itertools.count()
        self.evicted = 0
        """Connections closed to make room for a newer one (the module docstring's order)."""

    def __len__(self) -> int:
        return sum(len(held) for held in self._by_source.values())

    def held_by(self, source: str) -> int:
        return len(self._by_source.get(source, ()))

    def admit(self, source: str, close: Callable[[], None]) -> int:
        """Take a slot for a new connection from `source`, closing (`close` of the victim) the one that
        must give way; returns the ticket to `release` with."""
        held = self._by_source.get(source)
        if held is not None and len(held) >= self.limits.per_source:
            self._evict(source)
        elif len(self) >= self.limits.total:
            # Most connections first; among equals, the source whose oldest is oldest (lowest ticket).
            self._evict(max(self._by_source, key=lambda s: (len(self._by_source[s]), -next(iter(self._by_source[s])))))
        ticket = next(self._tickets)
        self._by_source.setdefault(source, OrderedDict())[ticket] = close
        return ticket

    def release(self, source: str, ticket: int) -> None:
        """The connection authenticated or ended; idempotent (an evicted one is gone already)."""
        held = self._by_source.get(source)
        if held is not None and held.pop(ticket, None) is not None and not held:
            del self._by_source[source]

    def _evict(self, source: str) -> None:
        held = self._by_source[source]
        _, close = held.popitem(last=False)
        if not held:
            del self._by_source[source]
        self.evicted += 1
        close()

    def check_invariants(self) -> None:
        assert all(self._by_source.values()), "a source with no connection is kept"
        assert all(len(h) <= self.limits.per_source for h in self._by_source.values()), "a source over per_source"
        assert len(self) <= self.limits.total, f"{len(self)} unauthenticated > {self.limits.total}"
