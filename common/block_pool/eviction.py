"""Which cached blocks a pool evicts first: the eviction orders, chosen by name from a registry, and
the cluster-aware preference for blocks that another node also holds."""

from collections.abc import Callable, Sequence
from typing import Protocol

from radixmesh.common.block_pool.adaptive import AdaptiveS3FIFO
from radixmesh.common.block_pool.lru import Group, LazyLRU
from radixmesh.common.block_pool.s3fifo import S3FIFO, Recalled
from radixmesh.proto.block_hash import BlockHash

CopiesElsewhere = Callable[[BlockHash], int]
"""How many other nodes hold a block (the cluster index's answer), for cluster-aware eviction."""


class EvictionOrder(Protocol):
    """The cached blocks (ref 0, hashed) of one pool, in the order they are evicted.

    Lazy: the order shares the pool's refcount list, and a member the pool pins (ref > 0) stays
    recorded but is no member until the pool pushes it again on release. Nothing here raises on the
    pool's behalf; the pool validates ids before it calls in.
    """

    def __contains__(self, block: int) -> bool:
        """Whether `block` is a member (cached, evictable)."""

    def push(self, blocks: Sequence[int], now: float) -> None:
        """`blocks` (hashed, just released to ref 0, none a member) become members, released at `now`;
        among equals, earlier blocks are evicted first."""

    def set_recall(self, recalled: Recalled | None) -> None:
        """Where the order learns which hashes the cluster evicted recently; orders without a
        history of evictions ignore it."""

    def group_of(self, blocks: tuple[int, ...]) -> Group | None:
        """A group that `renew` can move whole: exactly `blocks`, none evicted since (see LazyLRU)."""

    def renew(self, group: Group, now: float) -> None:
        """The group's blocks came back to ref 0 at `now` (the pool's fast release path)."""

    def discard(self, blocks: Sequence[int]) -> None:
        """Members or pinned blocks leave for good (evicted by GC or a contiguous carve)."""

    def demote(self, blocks: Sequence[int]) -> None:
        """Members `blocks` (distinct) are evicted before the other members, unless they are
        released again first (a re-use here renews them as usual)."""

    def pop_oldest(self, k: int) -> list[int]:
        """Remove and return the first k members in eviction order (fewer when there are fewer)."""

    def oldest(self, n: int) -> list[int]:
        """The first n members in eviction order (fewer when there are fewer); removes none."""

    def released_before(self, cutoff: float) -> list[int]:
        """Members released strictly before `cutoff` (GC's idle candidates)."""

    def members(self) -> list[int]:
        """Every member."""

    def check_invariants(self) -> None:
        """Raise AssertionError (with the numbers) on inconsistent bookkeeping."""


def _lru(ref: list[int], hashes: list[BlockHash | None]) -> EvictionOrder:
    return LazyLRU(ref)


EVICTION_ORDERS: dict[str, Callable[[list[int], list[BlockHash | None]], EvictionOrder]] = {
    "lru": _lru,
    "s3fifo": S3FIFO,
    "adaptive": AdaptiveS3FIFO,
}
"""Eviction orders by name; each is built over the pool's refcount and hash lists."""


DEFAULT_EVICTION = "adaptive"
"""The order pools, agents, deployments and the simulator run unless told otherwise. A fixed bet
lost somewhere: s3fifo won the Mooncake traces but its 10% probation dropped chat conversations
before their next turn (0.75x global LRU on a held-out chat trace at tight memory, lru 0.96x);
lru lost the scan-heavy traces. `adaptive` moves its probation share by which ghost the returning
blocks come from, and was chosen on the tuning half of bench/workload_hit_rate.py's workloads
(within 0.7% of the better of lru and s3fifo in every cell there); the held-out half is reported
beside it in the README."""

DEFAULT_HANDOFF = True
"""Whether an agent that delivered a pull puts those blocks first in its eviction order
(AgentConfig.handoff, TransferSource._release; the launcher and both simulators read it too, so
`radixmesh sim` and `bench --simulate` run what `radixmesh up` runs). On since 2026-12-08: a pull
copies a conversation onto the puller, and without hand-off both copies stay and evict other
conversations. On the real engine past the knee it kept `cost`'s hit rate at affinity's (44.7-44.9%
against 41.2% and 43.9% without); in the engine simulator at tight memory it gave convo's lost 1.1
points back and moved no goodput by more than 2%; the trace simulator is mixed (7 of 36 cells higher,
7 lower, all at tight memory: docs/benchmarks.md#hand-off-on-by-default-2026-12-08)."""


def make_eviction_order(name: str, ref: list[int], hashes: list[BlockHash | None]) -> EvictionOrder:
    """The order registered as `name`; ValueError naming the valid ones otherwise."""
    try:
        factory = EVICTION_ORDERS[name]
    except KeyError:
        raise ValueError(f"unknown eviction order {name!r}; valid: {sorted(EVICTION_ORDERS)}") from None
    return factory(ref, hashes)


class ClusterPreference:
    """Among the k + `window` next blocks of the eviction order (k: the blocks needed), evict first
    those another node also holds (a later request can pull them instead of recomputing), in order,
    then the rest in order: the cluster's last copy of a prefix outlives the duplicates around it."""

    def __init__(self, copies: CopiesElsewhere, window: int) -> None:
        if window < 0:
            raise ValueError(f"window must be >= 0, got {window}")
        self.copies, self.window = copies, window

    def choose(self, order: EvictionOrder, hashes: list[BlockHash | None], k: int) -> list[int]:
        """Remove and return k members of `order` (the pool knows k <= members)."""
        copies = self.copies
        window = order.oldest(k + self.window)
        victims = [b for b in window if copies(hashes[b]) > 0][:k]  # type: ignore[arg-type]  # cached: hashed
        if len(victims) < k:
            chosen = set(victims)
            victims += [b for b in window if b not in chosen][: k - len(victims)]
        order.discard(victims)
        return victims
