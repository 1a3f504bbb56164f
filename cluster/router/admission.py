"""Admission control: how many requests the router serves at once, and how many may wait for a turn.

Past both a request is refused at once (Overloaded: HTTP 429 with Retry-After) instead of queueing
without bound, so the latency of the requests that are accepted stays near the unloaded latency
and a burst never turns into a backlog that every later request pays for. Running slots scale with
the nodes behind the router (each runs `max_running_per_node` at once, its engine batch); waiting
requests are served first come first served and give up after `max_wait_s`.
"""

import asyncio
import collections
import contextlib
import math
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass


class Overloaded(Exception):
    """The request was refused for capacity; the client should retry after `retry_after_s`."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


@dataclass(frozen=True, slots=True)
class AdmissionLimits:
    max_running_per_node: int = 64
    """Requests served at once per node behind the router: the agents' engine batch
    (EngineConfig.max_num_seqs). At 32, half of every engine's batch could never fill: a modeled
    4-node H100 cluster was held by the router's slots, not its engines, and every routing policy
    served the same goodput past the knee (docs/benchmarks.md)."""
    max_waiting: int = 64
    """Requests waiting for a running slot at most; past it new ones are refused."""
    max_wait_s: float = 5.0
    """A request that waited this long for a slot is refused (it would miss any sane deadline)."""
    retry_after_s: float = 1.0
    """What refusals tell the client (Retry-After)."""

    def __post_init__(self) -> None:
        if self.max_running_per_node < 1 or self.max_waiting < 0:
            raise ValueError("need max_running_per_node >= 1 and max_waiting >= 0")
        for name in ("max_wait_s", "retry_after_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value}")


class Admission:
    """Running and waiting slots of one router (one event loop)."""

    def __init__(self, limits: AdmissionLimits, nodes: Callable[[], int]) -> None:
        self.limits = limits
        self._nodes = nodes
        self.running = 0
        self._waiting: collections.deque[asyncio.Future[None]] = collections.deque()

    @property
    def capacity(self) -> int:
        return max(1, self._nodes()) * self.limits.max_running_per_node

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def check(self) -> None:
        """Raise Overloaded now when a request would be refused: callers refuse before the work of
        parsing and tokenizing it, so that refusals stay cheap under overload."""
        if self.running >= self.capacity and len(self._waiting) >= self.limits.max_waiting:
            raise Overloaded(f"{self.running} requests running and {len(self._waiting)} waiting: retry later",
                             self.limits.retry_after_s)

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold a running slot for the body; raises Overloaded when none comes."""
        await self._acquire()
        try:
            yield
        finally:
            self._release()

    async def _acquire(self) -> None:
        if self.running < self.capacity and not self._waiting:
            self.running += 1
            return
        self.check()
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append(turn)
        try:
            async with asyncio.timeout(self.limits.max_wait_s):
                await asyncio.shield(turn)
        except TimeoutError:
            if turn.done():  # handed over just as time ran out: take it
                return
            self._waiting.remove(turn)
            raise Overloaded(f"no slot within {self.limits.max_wait_s:g} s: retry later",
                             self.limits.retry_after_s) from None
        except BaseException:  # the caller was cancelled while waiting
            if turn.done():
                self._release()  # the slot it was just handed goes to the next one
            else:
                self._waiting.remove(turn)
            raise

    def _release(self) -> None:
        """A slot ends: the first waiter takes it over, else it is free (capacity may have shrunk)."""
        while self._waiting:
            turn = self._waiting.popleft()
            if not turn.done():
                if self.running <= self.capacity:
                    turn.set_result(None)
                    return
                self._waiting.appendleft(turn)  # fewer nodes now: this slot goes away instead
                break
        self.running -= 1
