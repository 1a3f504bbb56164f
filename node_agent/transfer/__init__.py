"""The KV transfer plane: pulling prefix blocks from peers and serving them, over UCX or Ray.

Every part of the plane touches the pool and the prefix cache, which are not thread-safe, through a
`Serial`: the node agent passes EngineRunner.call, so every touch runs on its engine thread between
steps; a caller that owns the pool alone (tests, benchmarks, a standalone owner) passes run_inline.
This module imports no other part of the plane, so each of them imports Serial from here.
"""

from collections.abc import Awaitable, Callable
from typing import Any

Serial = Callable[..., Awaitable[Any]]
"""`await serial(fn, *args)` runs fn(*args) where the pool may be touched (the node agent's engine thread)."""


async def run_inline(fn: Callable[..., Any], *args: Any) -> Any:
    """The default Serial: the caller owns the pool alone, so call in place."""
    return fn(*args)
