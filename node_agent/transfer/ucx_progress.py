"""UCX progress on an asyncio loop that sleeps while UCX has nothing to do.

`UcxProgress`, one per event loop, drives the worker from the loop's reader on its epoll fd: it
progresses, resolves the futures of completed requests and arms the worker; every post kicks a
step, and a safety tick (`tick_s`) rescues what a missed wake-up left. `install(ucxx)` puts it in
place of ucxx 0.52's BlockingMode, which spun a core per idle process (issue 25). Why, and why not
the alternatives: docs/routing.md#ucx-progress-without-spinning.
"""

import asyncio
import itertools
from types import ModuleType
from typing import Any

ARM_TRIES = 8
"""Progress-and-arm attempts in one step before yielding to the loop (arm() is False while busy)."""
ORPHAN_KEEP_S = 120.0
"""How long the buffer of a request whose waiter was cancelled is kept for UCX: long past any message
still on its way (an owner aborts its endpoint when the requester hangs up, or after its 30 s send
timeout); then it is let go, so pulls that failed for good do not hold their staging for ever."""


class UcxProgress:
    """Progress for `worker` on `event_loop`, woken by the worker's epoll fd (see the module doc).

    Made by ucxx's context as `BlockingMode(worker, event_loop)` once install() has run.
    """

    tick_s = 1.0
    """Safety tick: the worker is progressed at least this often whatever its fd says."""

    def __init__(self, worker: Any, event_loop: asyncio.AbstractEventLoop):
        from ucxx._lib_async.application_context import ProgressTasks
        from ucxx.exceptions import UCXError

        self.worker = worker
        self.event_loop = event_loop
        self._error = UCXError
        self._registry: dict[Any, Any] = ProgressTasks
        """ucxx's progress per loop: once it no longer names this driver (ucxx.reset()), it stops."""
        self._pending: dict[int, tuple[Any, asyncio.Future[None], Any]] = {}
        """key -> (request, its waiter, the buffer UCX reads or writes: alive until the request ends)."""
        self._keys = itertools.count()
        self._orphaned: dict[int, float] = {}
        """key -> loop time its waiter was first seen cancelled."""
        self._step_scheduled = False
        self._retired = False
        self.wakeups = 0
        """Times the fd woke the loop."""
        self.arms = 0
        """Times the worker was armed."""
        self.rescued = 0
        """Requests found complete by the safety tick only."""
        worker.init_blocking_progress_mode()
        self._fd: int = worker.epoll_file_descriptor
        event_loop.add_reader(self._fd, self._on_fd)
        self._timer = event_loop.call_later(self.tick_s, self._tick)
        self.kick()

    @property
    def pending(self) -> int:
        """Requests posted through this driver that UCX has not completed (cancelled waiters included)."""
        return len(self._pending)

    def kick(self) -> None:
        """Progress and re-arm soon: after the callbacks that are ready now."""
        if not self._step_scheduled:
            self._step_scheduled = True
            self.event_loop.call_soon(self._step)

    def watch(self, request: Any, buffer: Any) -> "asyncio.Future[None]":
        """A future that ends with `request` (a UCXRequest just posted); `buffer` stays referenced
        until then."""
        waiter: asyncio.Future[None] = self.event_loop.create_future()
        self._pending[next(self._keys)] = (request, waiter, buffer)
        self.kick()
        return waiter

    def _on_fd(self) -> None:
        self.wakeups += 1
        self._progress_and_arm()

    def _step(self) -> None:
        self._step_scheduled = False
        if not self._retired:
            self._progress_and_arm()

    def _progress_and_arm(self) -> None:
        for _ in range(ARM_TRIES):
            self.worker.progress()
            if self._settle():
                self.kick()  # the woken tasks run first: they may post before we arm
                return
            if self.worker.arm():
                self.arms += 1
                return
        self.kick()  # UCX still busy: let the loop run, then try again

    def _tick(self) -> None:
        if self._registry.get(self.event_loop) is not self:
            self._retire()
            return
        self.worker.progress()
        self.rescued += self._settle()
        self._let_orphans_go()
        self.kick()
        self._timer = self.event_loop.call_later(self.tick_s, self._tick)

    def _let_orphans_go(self) -> None:
        now = self.event_loop.time()
        for k, (_, waiter, _) in list(self._pending.items()):
            if waiter.done() and now - self._orphaned.setdefault(k, now) > ORPHAN_KEEP_S:
                del self._pending[k], self._orphaned[k]

    def _retire(self) -> None:
        """ucxx's context that made this driver is gone (reset): stop waking for its worker, and fail
        what still waits on it (nothing progresses that worker any more)."""
        if not self.event_loop.is_closed():
            self.event_loop.remove_reader(self._fd)
        pending, self._pending = self._pending, {}
        self._orphaned.clear()
        for _, waiter, _ in pending.values():
            if not waiter.done():
                waiter.set_exception(self._error("UCX was reset with this request outstanding"))
        self._retired = True
        self.worker = None

    def _settle(self) -> int:
        """Resolve the waiters of completed requests; how many waiters were woken."""
        if not self._pending:
            return 0
        done = [k for k, (request, _, _) in self._pending.items() if request.completed]
        woken = 0
        for k in done:
            request, waiter, _ = self._pending.pop(k)
            self._orphaned.pop(k, None)
            if waiter.done():
                continue  # its waiter was cancelled: only the buffer was still held
            try:
                request.check_error()
            except self._error as e:
                waiter.set_exception(e)
            else:
                waiter.set_result(None)
            woken += 1
        return woken


def install(ucxx: ModuleType) -> None:
    """Make ucxx's context use UcxProgress for its "blocking" mode (idempotent; see the module doc)."""
    from ucxx._lib_async import application_context, continuous_ucx_progress

    current = getattr(application_context, "BlockingMode", None)
    if current is UcxProgress:
        return
    if current is not continuous_ucx_progress.BlockingMode:
        raise RuntimeError(f"ucxx {ucxx.__version__}: no BlockingMode to replace in its application context")
    application_context.BlockingMode = UcxProgress


def driver(ucxx: ModuleType) -> UcxProgress | None:
    """The running loop's UcxProgress (ucxx's progress started for this loop if it was not yet), or
    None where ucxx runs another progress mode."""
    ucxx.continuous_ucx_progress()
    from ucxx._lib_async import application_context

    task = application_context.ProgressTasks.get(asyncio.get_running_loop())
    return task if isinstance(task, UcxProgress) else None


def post_recv(ucxx: ModuleType, buffer: Any, tag: int) -> "asyncio.Future[None]":
    """Post a receive of the message tagged `tag` into `buffer` on this process's worker, now; the
    future ends when it has landed (UCXError when it failed)."""
    d = driver(ucxx)
    if d is None:
        return asyncio.ensure_future(ucxx.recv(buffer, tag=tag))
    from ucxx._lib.arr import Array
    from ucxx.types import Tag

    array = Array(buffer)
    return d.watch(d.worker.tag_recv(array, Tag(tag)), array)


def post_send(ucxx: ModuleType, ep: Any, buffer: Any, tag: int) -> "asyncio.Future[None]":
    """Post a send of `buffer` tagged `tag` (as is) on ucxx Endpoint `ep`, now; the future ends when
    UCX is done with `buffer`."""
    d = driver(ucxx)
    if d is None:
        return asyncio.ensure_future(ep.send(buffer, tag=tag, force_tag=True))
    from ucxx._lib.arr import Array
    from ucxx.types import Tag

    if ep.closed:
        raise ucxx.exceptions.UCXCloseError("Endpoint closed")
    # What Endpoint.send does before it waits by spinning: its UCXEndpoint is `_ep` (no public name).
    endpoint = ep._ep
    endpoint.raise_on_error()
    array = Array(buffer)
    return d.watch(endpoint.tag_send(array, Tag(tag)), array)


def nudge(ucxx: ModuleType) -> None:
    """After a ucxx call that progresses the worker itself (endpoint creation, abort): progress and
    re-arm soon, so nothing it left pending waits for the safety tick."""
    d = driver(ucxx)
    if d is not None:
        d.kick()
