"""Polling observable state with a deadline: the tests' one way to wait for something that another
thread, process or server changes and that offers nothing to await. Never a bare sleep."""

import asyncio
import contextlib
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def until(condition: Callable[[], bool | Awaitable[bool]], what: str = "the condition", *,
                timeout_s: float = 30.0, pause_s: float = 0.01) -> None:
    """Ask `condition` (plain or async: a coroutine, a Ray ObjectRef) until it holds; the test fails
    with `what` once `timeout_s` has passed. Between asks the loop runs for `pause_s` (0: one turn,
    for a condition that is itself a round trip or that only other tasks on this loop change)."""
    deadline = time.monotonic() + timeout_s
    while True:
        answer = condition()
        if inspect.isawaitable(answer):
            answer = await answer
        if answer:
            return
        assert time.monotonic() < deadline, f"timed out after {timeout_s:g} s waiting for {what}"
        await asyncio.sleep(pause_s)


def wait_for(what: str, probe: Callable[[], T | None], timeout_s: float, on_timeout: Callable[[], str] = str) -> T:
    """Blocking: call `probe` until it returns something other than None/False (an OSError, ValueError
    or KeyError counts as not yet) and return that; TimeoutError after `timeout_s`, with `on_timeout()`
    (say, the cluster's logs) in its message. For state other processes change, polled every 0.2 s."""
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(OSError, ValueError, KeyError):
            value = probe()
            if value is not None and value is not False:
                return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout_s:.0f} s\n{on_timeout()}")
        time.sleep(0.2)  # polling state another process changes: nothing to wait on
