"""EngineRunner: drives one Engine on one dedicated thread and streams each request's tokens.

Engine, NodeMemory, BlockPool and PrefixCache are not thread-safe, and step() is CPU-heavy. Every
touch of them (steps, submits, aborts, event draining, stats) is a job on one single-thread
executor, and runs under the runner's pool lock; the event loop (transfer server, heartbeats) never
takes the lock, so it never waits on a step.

The transfer plane's short jobs (pin and unpin a pull's blocks, allocate and insert a pull's landing
blocks: `call_short`) run on a second thread under the same lock, which a step lets go of for its
forward (Engine.forward_gate): the forward reads the KV and the block tables it was given and
touches no pool or cache structure, and the blocks it writes belong to running requests, never to a
pull. Run on the engine thread, a pull waited for the holder's step in progress, half a step on
average (0.6 s on a modeled H100 slowed 50x, the time to recompute ~300 tokens), so the router
recomputed a busy holder's prefix on an idle node rather than pull it.
"""

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

from radixmesh.node_agent.engine.engine import Engine
from radixmesh.node_agent.engine.request import Request, RequestId, RequestOutput
from radixmesh.node_agent.engine.step_rates import StepRates
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.serve.limits import InvalidRequest
from radixmesh.proto.serve.sampling import TokenLogprob

logger = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Finished:
    """The last item of a request stream (its output's stats say where its prompt came from)."""

    output: RequestOutput


@dataclass(frozen=True, slots=True)
class NewTokens:
    """Output tokens of one step, with their log-probabilities when the request asked for them."""

    token_ids: list[int]
    logprobs: list[TokenLogprob]


StreamItem = NewTokens | Finished | BaseException
"""New output tokens, the end of the request, or the error that ended the engine loop."""


class EngineRunner:
    """One engine, one thread. `call` runs any function on that thread; `submit` queues a request and
    returns the queue its StreamItems arrive on, in order, ending with Finished."""

    def __init__(self, engine: Engine, *, clock: Callable[[], float] = time.perf_counter,
                 on_job_end: Callable[[], object] = lambda: None) -> None:
        """`on_job_end` runs on the event loop after every job, steps included: whatever changed the
        engine or its memory (the cache events an idle agent's publisher waits for) ran in one."""
        self.engine = engine
        self._clock = clock
        self._on_job_end = on_job_end
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine")
        self._short = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine-short")
        self._lock = threading.Lock()
        """Held by every job that touches the engine, except a step during its forward."""
        engine.forward_gate = self._unlocked
        self._queues: dict[RequestId, asyncio.Queue[StreamItem]] = {}  # event loop only
        self._driver: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()
        """Set when a job other than a step ends: what an idle driver waits for."""
        self.steps = 0
        """Engine steps ended (counted on the event loop): what a following pull waits on (stepped)."""
        self._step_waiters: list[asyncio.Future[None]] = []
        self.pending_calls = 0
        """Jobs queued on or running on the engine thread (steps, submits, the transfer plane's pins)."""
        self.rates = StepRates()
        """The step floor and prefill rate its steps measured (what the agent heartbeats)."""

    async def call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run `fn` on the engine thread. The job completes even if the caller is cancelled, so a
        pool mutation is never skipped half way (its result is then dropped). Its end wakes an idle
        driver: the job may have made work (a submit, a landed pull, blocks given back)."""
        return await self._on_engine_thread(lambda: fn(*args, **kwargs), wakes=True)

    async def call_short(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """As `call`, for a short pool job (a pull's pins, allocations, inserts): it may run while a
        step's forward does, so it waits for the scheduling around a forward, not the forward."""
        return await self._locked(self._short, lambda: fn(*args, **kwargs), wakes=True)

    async def _on_engine_thread(self, job: Callable[[], T], *, wakes: bool) -> T:
        return await self._locked(self._executor, job, wakes=wakes)

    async def _locked(self, executor: ThreadPoolExecutor, job: Callable[[], T], *, wakes: bool) -> T:
        def run() -> T:
            with self._lock:
                return job()

        loop = asyncio.get_running_loop()
        self.pending_calls += 1
        fut = loop.run_in_executor(executor, run)
        fut.add_done_callback(self._job_done if wakes else self._step_done)
        return await asyncio.shield(fut)

    @contextlib.contextmanager
    def _unlocked(self) -> Iterator[None]:
        """Let short jobs in while the engine thread runs a forward (it holds the lock around it)."""
        self._lock.release()
        try:
            yield
        finally:
            self._lock.acquire()

    def _step_done(self, _: "asyncio.Future[Any]") -> None:
        self.pending_calls -= 1
        self.steps += 1
        waiters, self._step_waiters = self._step_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._on_job_end()

    def _job_done(self, _: "asyncio.Future[Any]") -> None:
        self.pending_calls -= 1
        self._changed.set()
        self._on_job_end()

    # --- what a peer's following pull reads (transfer.pull_source.BlockProgress) -------------
    def coming(self, block: BlockHash) -> bool:
        """Engine.computing; on the engine thread (the transfer source's Serial is call_short)."""
        return self.engine.computing(block)

    async def stepped(self, since: int) -> None:
        """Return once more than `since` steps have ended."""
        while self.steps <= since:
            waiter = asyncio.get_running_loop().create_future()
            self._step_waiters.append(waiter)
            await waiter

    async def submit(self, request: Request, *, on_refused: Callable[[], object] | None = None
                     ) -> "asyncio.Queue[StreamItem]":
        """Queue `request`; raises the engine's InvalidRequest (nothing queued) when it is refused, after
        running `on_refused` on the engine thread (it gives back what the request would have taken).

        Cancel-safe: the engine takes the request even when the caller is cancelled while waiting,
        and the queue exists from the start, so the caller's `abort` always finds the request."""
        queue: asyncio.Queue[StreamItem] = asyncio.Queue()
        self._queues[request.request_id] = queue
        try:
            await self.call(self._submit, request, on_refused)
        except InvalidRequest:
            self._queues.pop(request.request_id, None)
            raise
        if self._driver is None or self._driver.done():
            self._driver = asyncio.create_task(self._drive(), name="engine-driver")
        return queue

    async def abort(self, request_id: RequestId) -> bool:
        """Drop a request and its blocks; False when it already finished."""
        self._queues.pop(request_id, None)
        return await self.call(self._abort, request_id)

    @property
    def active_requests(self) -> int:
        """Requests with an open stream (queued or running)."""
        return len(self._queues)

    def is_active(self, request_id: RequestId) -> bool:
        """Whether a stream for `request_id` is open."""
        return request_id in self._queues

    async def close(self) -> None:
        """Abort every request (its stream ends with an error), stop the driver and the thread."""
        for rid, q in list(self._queues.items()):
            q.put_nowait(RuntimeError("the engine was stopped"))
            await self.abort(rid)
        if self._driver is not None:
            self._driver.cancel()
            await asyncio.gather(self._driver, return_exceptions=True)
        self._executor.shutdown(wait=True)
        self._short.shutdown(wait=True)

    # --- event loop side ---------------------------------------------------------------------
    async def _drive(self) -> None:
        while self._queues:
            # Cleared before the step is queued: a job that ends after this ran after the step (one
            # executor thread, FIFO) or during it, so a step that saw nothing to do cannot miss it.
            self._changed.clear()
            try:
                progress, idle = await self._on_engine_thread(self._step, wakes=False)
            except Exception as e:  # an engine bug: fail the streams loudly, keep the agent alive
                logger.exception("engine step failed")
                for q in self._queues.values():
                    q.put_nowait(e)
                self._queues.clear()
                return
            for rid, item in progress:
                if (queue := self._queues.get(rid)) is not None:
                    queue.put_nowait(item)
                    if isinstance(item, Finished):
                        del self._queues[rid]
            if idle:
                # Only requests waiting for their pulls (or for blocks): steps back to back would
                # spin a core the pulls' receivers need.
                await self._changed.wait()

    # --- engine thread side ------------------------------------------------------------------
    def _submit(self, request: Request, on_refused: Callable[[], object] | None) -> None:
        try:
            self.engine.submit(request)
        except InvalidRequest:
            if on_refused is not None:
                on_refused()
            raise

    def _measure(self, tokens: int, running: int, seconds: float) -> None:
        self.rates.measure(tokens, running, seconds)

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.rates.prefill_tokens_per_s

    @property
    def step_floor_s(self) -> float:
        return self.rates.step_floor_s

    def _abort(self, request_id: RequestId) -> bool:
        return self.engine.abort(request_id)

    def _step(self) -> tuple[list[tuple[RequestId, StreamItem]], bool]:
        """This step's stream items, and whether it was idle (Scheduler.idle)."""
        counters = self.engine.counters
        computed, moving = counters.computed_tokens, counters.moved_in_seconds
        running = len(self.engine.scheduler.running)
        t0 = self._clock()
        step = self.engine.step()
        # Less the time the step spent reading blocks into the gpu tier (a promotion from disk, a
        # swap-in), which the router prices apart (its swap time): counted in, a restarted agent's
        # disk-loading steps read as a prefill rate of ~100 tokens/s where it computes 2,000, and
        # the router's load cap then kept requests from the disk that held their prefix.
        seconds = self._clock() - t0 - (counters.moved_in_seconds - moving)
        self._measure(counters.computed_tokens - computed, running, seconds)
        new: dict[RequestId, NewTokens] = {}
        for rid, token, logprob in step.tokens:
            fresh = new.setdefault(rid, NewTokens([], []))
            fresh.token_ids.append(token)
            if logprob is not None:
                fresh.logprobs.append(logprob)
        items: list[tuple[RequestId, StreamItem]] = list(new.items())
        items += [(out.request_id, Finished(out)) for out in step.finished]
        return items, self.engine.scheduler.idle

