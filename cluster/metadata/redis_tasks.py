"""Stopping a task that talks to Redis.

redis-py's asyncio client retries a command that failed on its connection (its default `Retry`), and
a cancel that lands while a command times out can come back as redis' TimeoutError with the cancel
request withdrawn (`Task.cancelling()` back at 0): the task goes on as if never cancelled. A task
that then waits on an event nobody sets (the state-store writer between writes) never ends, and a
server's stop that awaits it hangs for good. `cancel_and_wait` repeats the cancel until it lands.
"""

import asyncio

RECANCEL_S = 0.1
"""How long one cancel is given before it is sent again (a retry schedule, not a synchronisation)."""


async def cancel_and_wait(*tasks: "asyncio.Future[object]") -> None:
    """Cancel `tasks` and wait until each has ended, cancelling again any that swallowed a cancel.
    What they raised or returned is dropped (their owner is stopping them)."""
    pending = {t for t in tasks if not t.done()}
    while pending:
        for t in pending:
            t.cancel()
        _, pending = await asyncio.wait(pending, timeout=RECANCEL_S)
    for t in tasks:
        if not t.cancelled():
            t.exception()  # retrieved: no "exception was never retrieved" warning
