"""Memory zones: one node budget split into weights, activations, running KV and prefix cache, each
with its own allotment and reclaim rule, and the watermark monitor that lends allotment between them.

    zone         | used                                   | reclaimed
    weights      | model parameters                       | at teardown only
    activations  | peak bytes of the last forward step    | after each forward (the peak drops)
    kv           | blocks held by running sequences       | at sequence end (or preemption)
    prefix       | cached blocks (ref 0, hashed)          | LRU eviction, at once

Only kv and prefix, slots of one pool tensor, lend to each other; allotments always sum to the
budget (`check_invariants`). The borrowing rules and why: docs/memory.md#zones.
"""

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum


class ZoneName(StrEnum):
    WEIGHTS = "weights"
    ACTIVATIONS = "activations"
    KV = "kv"
    PREFIX = "prefix"


ZONES = tuple(ZoneName)
ELASTIC = frozenset({ZoneName.KV, ZoneName.PREFIX})
"""The zones that share one physical pool, so allotment can move between them."""


@dataclass(frozen=True, slots=True)
class ZoneConfig:
    """Watermarks and the borrowing rate; the split itself comes from the node's measured sizes."""

    high_watermark: float = 0.85
    """A zone whose W = used / allotted is above this borrows (or, as a lender, recalls its loans)."""
    low_watermark: float = 0.5
    """Only a zone below this lends; a borrower below it returns what it does not need."""
    borrow_step: float = 0.05
    """The most one move takes from a lender, as a fraction of the lender's base allotment."""
    borrow_interval_s: float = 1.0
    """The least time between two borrows by the same zone (with borrow_step: the rate limit)."""

    def __post_init__(self) -> None:
        if not 0.0 < self.low_watermark < self.high_watermark <= 1.0:
            raise ValueError(f"need 0 < low_watermark < high_watermark <= 1, got {self.low_watermark}, "
                             f"{self.high_watermark}")
        if not 0.0 < self.borrow_step <= 1.0:
            raise ValueError(f"borrow_step must be in (0, 1], got {self.borrow_step}")
        if not (math.isfinite(self.borrow_interval_s) and self.borrow_interval_s >= 0):
            raise ValueError(f"borrow_interval_s must be a finite number >= 0, got {self.borrow_interval_s}")


@dataclass(slots=True)
class Zone:
    """One zone's live state (bytes)."""

    name: ZoneName
    base: int
    """The allotment from the split, before loans."""
    used: int = 0
    borrowed: int = 0
    lent: int = 0
    borrows: int = 0
    """Moves in which this zone borrowed (a counter)."""
    returns: int = 0
    """Moves in which this zone gave borrowed bytes back, returned or recalled (a counter)."""
    last_borrow: float = -math.inf

    @property
    def allotted(self) -> int:
        return self.base + self.borrowed - self.lent

    @property
    def watermark(self) -> float:
        """used / allotted; infinite when something is used and nothing allotted, 0 when neither."""
        if self.allotted <= 0:
            return math.inf if self.used else 0.0
        return self.used / self.allotted


class ZoneBudget:
    """The zones of one node and the loans between them. Plain state: the caller feeds usage and the
    clock to `tick` and applies the allotments it reads back (ZonedPool does for kv and prefix)."""

    def __init__(self, base: Mapping[ZoneName, int], config: ZoneConfig | None = None, *,
                 elastic: frozenset[ZoneName] = ELASTIC) -> None:
        if set(base) != set(ZONES) or any(b < 0 for b in base.values()):
            raise ValueError(f"need a base allotment >= 0 for each of {[z.value for z in ZONES]}, got {dict(base)}")
        self.config = config or ZoneConfig()
        self.elastic = elastic
        """The zones that may lend and borrow."""
        self.zones = {z: Zone(z, base[z]) for z in ZONES}
        self.total = sum(base.values())
        self.loans: dict[tuple[ZoneName, ZoneName], int] = {}
        """(borrower, lender) -> bytes lent."""

    def __getitem__(self, name: ZoneName) -> Zone:
        return self.zones[name]

    def allotted(self, name: ZoneName) -> int:
        return self.zones[name].allotted

    def tick(self, now: float, used: Mapping[ZoneName, int]) -> list[tuple[ZoneName, ZoneName, int]]:
        """Record usage, then recall, return and borrow; the moves made as (to, from, bytes)."""
        for name, n in used.items():
            self.zones[name].used = n
        moves = self._recall() + self._return()
        moves += self._borrow(now)
        return moves

    def _recall(self) -> list[tuple[ZoneName, ZoneName, int]]:
        # The lender's own need comes first: a lender above `high` takes all its loans back at once.
        moves = []
        for (borrower, lender), n in sorted(self.loans.items()):
            if self.zones[lender].watermark > self.config.high_watermark:
                self._move_back(borrower, lender, n)
                moves.append((lender, borrower, n))
        return moves

    def _return(self) -> list[tuple[ZoneName, ZoneName, int]]:
        moves = []
        low = self.config.low_watermark
        for (borrower, lender), n in sorted(self.loans.items()):
            z = self.zones[borrower]
            if z.watermark >= low:
                continue
            # Give back what keeps used / allotted <= low after the return, no more (no oscillation).
            spare = z.allotted - math.ceil(z.used / low)
            back = min(n, spare)
            if back > 0:
                self._move_back(borrower, lender, back)
                moves.append((lender, borrower, back))
        return moves

    def _borrow(self, now: float) -> list[tuple[ZoneName, ZoneName, int]]:
        cfg = self.config
        moves = []
        elastic = [z for z in self.zones.values() if z.name in self.elastic]
        hungry = sorted((z for z in elastic if z.watermark > cfg.high_watermark),
                        key=lambda z: -z.watermark)
        for z in hungry:
            if now - z.last_borrow < cfg.borrow_interval_s:
                continue
            lenders = sorted((x for x in elastic if x is not z and x.watermark < cfg.low_watermark
                              and not x.borrowed), key=lambda x: (x.watermark, x.name))
            for lender in lenders:
                # Never past the lender's own low watermark, never more than one step of its base.
                spare = lender.allotted - math.ceil(lender.used / cfg.low_watermark)
                want = math.ceil(z.used / ((cfg.low_watermark + cfg.high_watermark) / 2)) - z.allotted
                n = min(spare, int(cfg.borrow_step * lender.base), max(want, 0))
                if n <= 0:
                    continue
                lender.lent += n
                z.borrowed += n
                z.borrows += 1
                z.last_borrow = now
                self.loans[(z.name, lender.name)] = self.loans.get((z.name, lender.name), 0) + n
                moves.append((z.name, lender.name, n))
                break
        return moves

    def _move_back(self, borrower: ZoneName, lender: ZoneName, n: int) -> None:
        b, x = self.zones[borrower], self.zones[lender]
        b.borrowed -= n
        x.lent -= n
        b.returns += 1
        left = self.loans[(borrower, lender)] - n
        if left:
            self.loans[(borrower, lender)] = left
        else:
            del self.loans[(borrower, lender)]

    def check_invariants(self) -> None:
        """Allotments sum to the budget; each zone's loans match the loan table; nothing negative."""
        zones = self.zones.values()
        assert sum(z.allotted for z in zones) == self.total, (
            f"allotments {[(z.name.value, z.allotted) for z in zones]} do not sum to {self.total}")
        for z in zones:
            lent = sum(n for (_, lender), n in self.loans.items() if lender == z.name)
            borrowed = sum(n for (borrower, _), n in self.loans.items() if borrower == z.name)
            assert (z.lent, z.borrowed) == (lent, borrowed), f"{z.name}: {z.lent}/{z.borrowed} vs {lent}/{borrowed}"
            assert z.allotted >= 0 and all(n > 0 for n in self.loans.values()), (z, self.loans)
            assert not (z.lent and z.borrowed), f"{z.name} both lends and borrows"
