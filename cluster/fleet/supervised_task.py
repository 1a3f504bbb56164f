"""SupervisedTask: a background task that is run again, after a backoff, when it fails.

A task that follows a stream (an engine's KV events, the metadata service's index) must not end for
good on an exception nobody expected: what it feeds would freeze while every reader takes it as
current. A SupervisedTask runs `body` until `stop`; when `body` raises (anything but a cancellation)
it logs the exception with its traceback, counts a restart, calls `on_failure` (where the owner marks
what the task feeds as stale), waits the backoff and runs `body` again. It lives in the fleet layer,
the lowest that has such tasks, so the router above can use it too.
"""

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from radixmesh.common.backoff import Backoff

logger = logging.getLogger(__name__)


DEFAULT_BACKOFF = Backoff(initial_s=0.1, max_s=10.0)
"""A body that ran at least `max_s` before it failed counts as healthy: its restart waits `initial_s` again."""


class SupervisedTask:
    """`body` as a task on the loop that calls `start`, run again after each failure until `stop`.

    `on_failure` gets the exception before the pause; it runs on the loop and must not raise. A body
    that returns ends the task (there is nothing left to supervise).
    """

    def __init__(self, name: str, body: Callable[[], Awaitable[None]], on_failure: Callable[[Exception], None],
                 *, backoff: Backoff = DEFAULT_BACKOFF, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.name = name
        self._body = body
        self._on_failure = on_failure
        self.backoff = backoff
        self._clock = clock
        self._sleep = sleep
        self.restarts = 0
        """Times `body` failed and was (or is about to be) run again."""
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        """Start on the running loop; idempotent."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._supervise(), name=self.name)

    async def stop(self) -> None:
        """Cancel the body (or the pause) and wait for it; a later `start` begins again."""
        if self._task is not None:
            task, self._task = self._task, None
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _supervise(self) -> None:
        failures = 0  # consecutive: a body that ran at least backoff.max_s before it failed starts over at 1
        while True:
            started = self._clock()
            try:
                await self._body()
                return
            except Exception as e:  # the point of supervision: CancelledError (a BaseException) still ends it
                failures = 1 if self._clock() - started >= self.backoff.max_s else failures + 1
                pause = self.backoff.pause(failures)
                self.restarts += 1
                logger.error("%s failed (%s: %s): restart %d in %.2f s", self.name, type(e).__name__, e,
                             self.restarts, pause, exc_info=e)
                self._on_failure(e)
                await self._sleep(pause)  # a restart schedule, not a synchronisation
