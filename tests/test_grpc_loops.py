"""The suite's grpc guard (tests/support/grpc_loops.py): a completion grpc delivers for a closed loop is
dropped by the running test's loop; any other callback error still fails the test."""

import asyncio

import pytest
from anyio._backends._asyncio import TestRunner as AnyioRunner

from tests.support.grpc_loops import stale_completion


class PollerCompletionQueue:
    """Stands in for grpc's poller: its callbacks are named by their bound method in the handle."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._dead = loop

    def _handle_events(self) -> None:
        self._dead.call_soon_threadsafe(lambda: None)


def test_a_completion_for_a_closed_loop_is_dropped_and_other_errors_are_not() -> None:
    dead = asyncio.new_event_loop()
    dead.close()
    with AnyioRunner() as runner:
        loop = runner.get_loop()
        loop.call_soon(PollerCompletionQueue(dead)._handle_events)
        runner.run_test(asyncio.sleep, {"delay": 0})  # the stale completion is dropped
        loop.call_soon(dead.call_soon_threadsafe, print)  # the same error from another callback is not
        with pytest.raises(RuntimeError, match="Event loop is closed"):
            runner.run_test(asyncio.sleep, {"delay": 0})


def test_stale_completion_names_grpcs_poller_and_the_closed_loop_only() -> None:
    loop = asyncio.new_event_loop()
    loop.close()
    handle = asyncio.Handle(PollerCompletionQueue(loop)._handle_events, (), loop)
    assert stale_completion({"exception": RuntimeError("Event loop is closed"), "handle": handle})
    assert not stale_completion({"exception": RuntimeError("something else"), "handle": handle})
    assert not stale_completion({"exception": ValueError("Event loop is closed"), "handle": handle})
    assert not stale_completion({"exception": RuntimeError("Event loop is closed"), "handle": None})
