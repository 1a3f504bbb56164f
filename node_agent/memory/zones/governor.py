"""A block pool governed by zones: once per engine step the governor measures every zone, asks its
policy for the kv and prefix caps and sets them on the pool (BlockPool.set_zone_limits)."""

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from radixmesh.common.block_pool.block_pool import BlockPool
from radixmesh.node_agent.memory.zones.budget import ZoneBudget, ZoneConfig, ZoneName
from radixmesh.node_agent.memory.zones.policy import make_zone_policy


@dataclass(frozen=True, slots=True)
class ZoneSetup:
    """Which zone policy a node runs and how its pool is split between kv and prefix."""

    policy: str = "shared"
    """``shared`` (one pool, zones only measured), ``fixed`` or ``borrow`` (zones/policy.py)."""
    kv_fraction: float = 0.6
    """The kv zone's base share of the pool's blocks; the prefix zone gets the rest."""
    watermarks: ZoneConfig = field(default_factory=ZoneConfig)

    def __post_init__(self) -> None:
        make_zone_policy(self.policy)  # validates the name
        if not 0.0 < self.kv_fraction < 1.0:
            raise ValueError(f"kv_fraction must be in (0, 1), got {self.kv_fraction}")


class ZoneGovernor:
    """The four zones of one node over its gpu pool. Weights and the activation allotment are bytes
    measured outside the pool (set_weights_bytes, after_step); kv and prefix are the pool's blocks."""

    def __init__(self, pool: BlockPool, setup: ZoneSetup | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.pool = pool
        self.setup = setup or ZoneSetup()
        self.policy = make_zone_policy(self.setup.policy)
        self._clock = clock
        bb = max(pool.block_bytes, 1)  # a pool without byte sizes counts in blocks
        self._bb = bb
        kv = math.floor(pool.num_blocks * self.setup.kv_fraction) * bb
        self.budget = ZoneBudget({ZoneName.WEIGHTS: 0, ZoneName.ACTIVATIONS: 0, ZoneName.KV: kv,
                                  ZoneName.PREFIX: pool.num_blocks * bb - kv}, self.setup.watermarks)
        self.activation_peak = 0
        """The largest step peak seen: the activation zone's allotment (its reclaim is per step)."""

    def set_weights_bytes(self, n: int) -> None:
        """The model's parameter bytes: the weights zone, allotted exactly what it uses."""
        self._resize(ZoneName.WEIGHTS, n)
        self.budget[ZoneName.WEIGHTS].used = n

    def after_step(self, activation_bytes: int) -> None:
        """Record a forward step's measured activation peak, then rebalance the pool's zones."""
        self.activation_peak = max(self.activation_peak, activation_bytes)
        self._resize(ZoneName.ACTIVATIONS, self.activation_peak)
        self.budget[ZoneName.ACTIVATIONS].used = activation_bytes
        self.rebalance()

    def rebalance(self) -> None:
        pool, bb = self.pool, self._bb
        used = {ZoneName.KV: pool.num_in_use * bb, ZoneName.PREFIX: pool.num_cached * bb}
        kv, prefix = self.policy.limits(self.budget, self._clock(), used)
        if kv is None or prefix is None:
            pool.set_zone_limits(None if kv is None else kv // bb, None if prefix is None else prefix // bb)
            return
        # Loans are bytes, not whole blocks: kv gets the whole blocks of its allotment, prefix the rest
        # (the two allotments always sum to the pool, so no block is lost to rounding).
        pool.set_zone_limits(kv // bb, pool.num_blocks - kv // bb)

    def _resize(self, name: ZoneName, n: int) -> None:
        # Weights and activations sit outside the pool: their allotment is what was measured, so the
        # budget grows with them (they never lend or borrow, ZoneBudget.elastic).
        z = self.budget[name]
        self.budget.total += n - z.base
        z.base = n
