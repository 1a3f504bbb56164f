"""Open-loop arrivals and the requests sent at them: Poisson arrival times at an offered rate, each
given the next turn of a session (a conversation, a set of questions, an agent task).

Arrivals are exactly Poisson at the offered rate; the sessions decide only what each arrival sends.
At each arrival the session that has been ready longest (its think time since its previous turn
has passed) sends its next turn; when none is ready a new session starts. So think times are lower
bounds, the number of users grows with the rate, and every arm of a bench sees the same requests.
"""

import heapq
import itertools
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Turn:
    """One request of a session."""

    prompt: tuple[int, ...]
    """Prompt token ids."""
    max_tokens: int
    """Output tokens (sent with ignore_eos, so every arm generates exactly these)."""
    think_s: float = 0.0
    """Least time after the session's previous turn before this one is sent (0 for a first turn)."""


class Workload(Protocol):
    """A seeded source of sessions; the same rng state gives the same sessions."""

    @property
    def name(self) -> str:
        """What the results call it: chat, docs, agent, trace."""
        ...

    def sessions(self, rng: random.Random) -> Iterator[Sequence[Turn]]:
        """Sessions in order, each a non-empty sequence of turns; may be endless."""
        ...


@dataclass(frozen=True, slots=True)
class BenchRequest:
    """One request of a cell: when it is sent (seconds from the cell's start) and what it asks."""

    index: int
    arrival_s: float
    session: int
    turn: int
    prompt: tuple[int, ...]
    max_tokens: int


def poisson_times(rate: float, rng: random.Random) -> Iterator[float]:
    """The endless arrival times of a Poisson process of `rate` per second."""
    if not rate > 0:
        raise ValueError(f"rate must be > 0, got {rate}")
    t = rng.expovariate(rate)
    while True:
        yield t
        t += rng.expovariate(rate)


def schedule(workload: Workload, rate: float, duration_s: float, seed: int) -> list[BenchRequest]:
    """The requests of one offered rate that arrive in [0, duration_s): see `open_loop`."""
    if not (rate > 0 and duration_s > 0):
        raise ValueError(f"rate and duration must be > 0, got {rate} and {duration_s}")
    return list(itertools.takewhile(lambda r: r.arrival_s < duration_s, open_loop(workload, rate, seed)))


def open_loop(workload: Workload, rate: float, seed: int) -> Iterator[BenchRequest]:
    """The requests of one offered rate in arrival order: Poisson arrivals seeded by (seed, rate), sessions
    by seed alone (so a higher rate sends the same sessions, more of them at once). Endless, unless a
    finite workload (a trace) runs out of sessions."""
    arrivals = poisson_times(rate, random.Random(f"{seed}/arrivals/{rate!r}"))
    sessions = workload.sessions(random.Random(f"{seed}/sessions"))
    started: list[Sequence[Turn]] = []
    # (ready at, session, next turn): the heap's order is "ready longest", then the older session
    ready: list[tuple[float, int, int]] = []
    for index, t in enumerate(arrivals):
        if ready and ready[0][0] <= t:
            _, s, k = heapq.heappop(ready)
        else:
            session = next(sessions, None)
            if session is None:
                return
            s, k = len(started), 0
            started.append(session)
        turn = started[s][k]
        yield BenchRequest(index, t, s, k, turn.prompt, turn.max_tokens)
        if k + 1 < len(started[s]):
            heapq.heappush(ready, (t + started[s][k + 1].think_s, s, k + 1))


def random_tokens(rng: random.Random, n: int, vocab: int) -> tuple[int, ...]:
    """`n` token ids drawn uniformly from [0, vocab)."""
    return tuple(rng.choices(range(vocab), k=n))


def count_sessions(requests: Sequence[BenchRequest]) -> int:
    """Distinct sessions among `requests`."""
    return len({r.session for r in requests})

