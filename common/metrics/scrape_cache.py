"""A /metrics exposition rendered at most once per `ttl_s` per scope: the router's and each agent's own.

A render asks every agent for its text, and each agent renders on its engine thread: N scrapers (or
one client in a loop) must not make N renders. Scrapes that arrive while a render runs wait for it;
scrapes within `ttl_s` after it ended get its text. Prometheus scrapes every few seconds, so a text
up to `ttl_s` old changes nothing it records. A render that fails is not kept: the next scrape
renders again.
"""

import asyncio
import functools
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

DEFAULT_TTL_S = 1.0


@dataclass(slots=True)
class _Render:
    task: "asyncio.Task[str]"
    ended_at: float | None = None
    """When the render ended (None while it runs)."""


class ScrapeCache:
    """One shared, briefly kept render per key. Use from one event loop."""

    def __init__(self, ttl_s: float = DEFAULT_TTL_S, clock: Callable[[], float] = time.monotonic) -> None:
        if not ttl_s >= 0:
            raise ValueError(f"ttl_s must be >= 0, got {ttl_s}")
        self._ttl_s = ttl_s
        self._clock = clock
        self._renders: dict[str, _Render] = {}

    async def text(self, key: str, render: Callable[[], Coroutine[Any, Any, str]]) -> str:
        """The text of the running render for `key`, or of one that ended under `ttl_s` ago, or of a
        new `render()`; its exception when it fails."""
        current = self._renders.get(key)
        if current is None or (current.ended_at is not None and self._clock() - current.ended_at >= self._ttl_s):
            current = self._renders[key] = _Render(asyncio.create_task(render(), name=f"metrics-render-{key}"))
            current.task.add_done_callback(functools.partial(self._ended, key, current))
        # shield: a scraper that disconnects (its handler is cancelled) must not cancel the render
        # the other scrapers wait for.
        return await asyncio.shield(current.task)

    def _ended(self, key: str, entry: _Render, task: "asyncio.Task[str]") -> None:
        if task.cancelled() or task.exception() is not None:  # exception(): retrieved, even with no waiter left
            if self._renders.get(key) is entry:
                del self._renders[key]
            return
        entry.ended_at = self._clock()
