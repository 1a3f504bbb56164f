"""A guard for the suite: no grpc.aio channel or server may stay open past the event loop it was made on.

grpc.aio hands every completion to the loop its call was made on, from one process-wide poller. An
object left open when its loop closes (a test's loop, or an `asyncio.run` inside a sync test) still
has completions coming (its cancelled calls', its close when the collector finds it), and grpc
delivers them through whichever loop is running grpc then: that loop's callback fails with "Event
loop is closed", and the test that owns it errors at a random point, far from the cause. The guard
fails the test that left the object open instead (tests/conftest.py's `grpc_closed_with_its_loop`).

A completion can still reach a closed loop from an object that was closed in time (a cancelled call's
late completion): grpc then fails on the next test's loop with "Event loop is closed" raised for the
dead one (a fresh-clone CI run, 2026-12-07: a `served` fixture's setup in test_reset_prefix_cache).
`stale_completion` names that error, and the suite's loops drop it: it concerns a loop that is gone,
never the test that happens to be running.
"""

import weakref
from collections.abc import Callable
from typing import Any

import grpc.aio._channel
import grpc.aio._server

_made: list[tuple["weakref.ref[Any]", str]] = []
"""The channels and servers made since the last `left_open`, weakly, with what each is."""


def _tracked(cls: type, kind: str) -> None:
    init: Callable[..., None] = cls.__init__  # type: ignore[misc]

    def tracking_init(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        _made.append((weakref.ref(self), kind))

    cls.__init__ = tracking_init  # type: ignore[misc]


def track() -> None:
    """Record every grpc.aio channel and server made from now on (once per process)."""
    if not getattr(track, "done", False):
        _tracked(grpc.aio._channel.Channel, "channel")
        _tracked(grpc.aio._server.Server, "server")
        track.done = True  # type: ignore[attr-defined]


def left_open() -> list[str]:
    """What was made since the last call and is still open on a closed loop. Objects whose loop
    still runs (a module-scoped fixture's) are kept for the next call."""
    found, alive = [], []
    for ref, kind in _made:
        obj = ref()
        if obj is None:
            continue
        is_open = obj._server.is_running() if kind == "server" else not obj._channel.closed()
        if not is_open:
            continue
        if obj._loop.is_closed():
            found.append(f"a grpc.aio {kind} ({obj!r})")
        else:
            alive.append((ref, kind))
    _made[:] = alive
    return found


def stale_completion(context: dict[str, Any]) -> bool:
    """Whether an event loop's callback error (`context`, as loop exception handlers get it) is grpc's
    poller delivering a completion to a loop that has closed."""
    error = context.get("exception")
    return (isinstance(error, RuntimeError) and str(error) == "Event loop is closed"
            and "PollerCompletionQueue._handle_events" in repr(context.get("handle")))


def drop_stale_completions() -> None:
    """Make the async tests' loops (anyio's TestRunner) drop `stale_completion` errors; every other
    callback error still fails the test (once per process)."""
    from anyio._backends._asyncio import TestRunner

    if getattr(drop_stale_completions, "done", False):
        return
    handle: Callable[..., None] = TestRunner._exception_handler

    def handler(self: Any, loop: Any, context: dict[str, Any]) -> None:
        if not stale_completion(context):
            handle(self, loop, context)

    TestRunner._exception_handler = handler  # type: ignore[method-assign]
    drop_stale_completions.done = True  # type: ignore[attr-defined]
