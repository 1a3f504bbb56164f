"""The n choices of one prompt (OpenAI's `n`), served as n requests that share one prefill.

Choice 0 is routed as any request. Once its first piece is out, its prompt's full blocks are in its
node's prefix cache, and choices 1..n-1 start pinned to that node (Router.generate's `node`): their
prompts hit the cache instead of being prefilled n times (vLLM prefills once and forks; here the
prefix cache does the sharing). They then run concurrently, their pieces merged in arrival order.
"""

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from dataclasses import replace
from typing import Generic, TypeVar

from radixmesh.proto.ids import NodeId
from radixmesh.proto.serve.plan import ServePlan
from radixmesh.proto.serve.sampling import SamplingParams

T = TypeVar("T")


def choice_requests(request_id: str, tokens: tuple[int, ...], sampling: SamplingParams, tenant: str, n: int
                    ) -> list[ServePlan]:
    """One request per choice; with a seed, choice i samples with seed + i (distinct, reproducible)."""
    if n == 1:
        return [ServePlan(request_id, tokens, sampling, tenant)]
    seeds = [None if sampling.seed is None else sampling.seed + i for i in range(n)]
    return [ServePlan(f"{request_id}-{i}", tokens, replace(sampling, seed=seed), tenant)
            for i, seed in enumerate(seeds)]


class FirstNode:
    """Remembers the node choice 0 was (last) routed to: Router.generate's `on_routed`."""

    def __init__(self) -> None:
        self.node: NodeId | None = None

    def __call__(self, node: NodeId) -> None:
        self.node = node


class _Done(Generic[T]):
    pass


async def merge_choices(first: AsyncIterator[T], rest: Callable[[], Sequence[AsyncGenerator[T, None]]]
                        ) -> AsyncGenerator[tuple[int, T], None]:
    """(choice index, item) of `first`, then, once `first` yielded its first item, of the streams
    `rest()` makes, interleaved as they come. The first failure of any stream is raised here; closing
    this generator (or a failure) cancels and closes every stream."""
    head = await anext(first)
    yield 0, head
    streams: list[AsyncIterator[T]] = [first, *rest()]
    queue: asyncio.Queue[tuple[int, T | _Done[T] | BaseException]] = asyncio.Queue()

    async def pump(i: int, stream: AsyncIterator[T]) -> None:
        try:
            async for item in stream:
                await queue.put((i, item))
            await queue.put((i, _Done()))
        except Exception as e:  # noqa: BLE001 (handed to the consumer, which raises it)
            await queue.put((i, e))

    tasks = [asyncio.create_task(pump(i, s), name=f"choice-{i}") for i, s in enumerate(streams)]
    try:
        live = len(tasks)
        while live:
            i, item = await queue.get()
            if isinstance(item, _Done):
                live -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for s in streams:
            if isinstance(s, AsyncGenerator):
                with contextlib.suppress(Exception):
                    await s.aclose()
