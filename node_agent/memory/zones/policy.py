"""How a node's kv and prefix zones share its block pool: a registry of policies.

- ``shared`` (the default): one pool, no zone caps. Running KV takes any block (evicting cached ones
  least recently released first) and the prefix cache keeps every block no one else wants. Zones are
  measured and watermarked (metrics, alerts) but bound nothing. bench/zones.py: it served the most
  requests at the SLO with the fewest OOMs and the best hit rate of the three (bench/results/zones.json).
- ``fixed``: kv and prefix each capped at their base allotment.
- ``borrow``: the caps follow ZoneBudget's watermark monitor (lending between kv and prefix).
"""

from collections.abc import Callable, Mapping

from radixmesh.node_agent.memory.zones.budget import ZoneBudget, ZoneName

Limits = tuple[int | None, int | None]
"""(kv bytes, prefix bytes) caps; None: uncapped."""


class ZonePolicy:
    """Turns the zones' usage at one instant into the pool's kv and prefix caps."""

    name = "shared"

    def limits(self, budget: ZoneBudget, now: float, used: Mapping[ZoneName, int]) -> Limits:
        for name, n in used.items():
            budget[name].used = n
        return None, None


class FixedSplit(ZonePolicy):
    name = "fixed"

    def limits(self, budget: ZoneBudget, now: float, used: Mapping[ZoneName, int]) -> Limits:
        super().limits(budget, now, used)
        return budget[ZoneName.KV].base, budget[ZoneName.PREFIX].base


class Borrowing(ZonePolicy):
    name = "borrow"

    def limits(self, budget: ZoneBudget, now: float, used: Mapping[ZoneName, int]) -> Limits:
        budget.tick(now, used)
        return budget.allotted(ZoneName.KV), budget.allotted(ZoneName.PREFIX)


ZONE_POLICIES: dict[str, Callable[[], ZonePolicy]] = {p.name: p for p in (ZonePolicy, FixedSplit, Borrowing)}


def make_zone_policy(name: str) -> ZonePolicy:
    try:
        return ZONE_POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown zone policy {name!r}: one of {sorted(ZONE_POLICIES)}") from None
