"""The suite's xdist schedule (tests/conftest.py's `pytest_xdist_make_scheduler`).

Every module under tests/ray/ starts a Ray head (in-process, `radixmesh up` or the multi-host `ray up`)
and is one scope, so its module fixtures build the head once; every other test is a scope of its own.
Which scope a worker takes next (`next_scope`):

1. Ray modules are queued first, the multi-host modules first of all, then the rest in file order,
   then the tests of the Ray modules in SPLIT_RAY_MODULES, each a scope of its own.
2. While other tests are left, Ray modules go to one worker at a time (the one already running them),
   one after another, and the other workers take the rest: one Ray head beside the other tests.
3. Once only Ray modules are left, a second worker takes them too (the tail), so neither worker waits
   idle for the other's chain: two local heads at once, never more.
4. A multi-host module (a head spanning network namespaces) never runs beside another Ray module:
   that pair starved each other on two cores.
"""

from collections import OrderedDict
from collections.abc import Collection, Sequence
from pathlib import PurePosixPath
from typing import Any

from xdist.scheduler import LoadScopeScheduling

RAY_FOLDER = PurePosixPath("tests/ray")
"""Every module that starts a Ray head lives under this folder (node ids are relative to the rootdir)."""
MULTIHOST_FOLDER = RAY_FOLDER / "multihost"
"""The modules whose head spans network namespaces (`ray up` on namespace hosts)."""
MAX_RAY_WORKERS = 2
"""Workers that may run Ray modules at once, in the tail (3.)."""
SPLIT_RAY_MODULES = frozenset({RAY_FOLDER / "test_bench_smoke.py"})
"""Ray modules whose tests share no module fixture (each smoke starts its own cluster in a subprocess):
each test is a scope, queued last, so the tail, where both workers take Ray scopes, ends in short units
and neither worker waits out a long module alone (15-50 s units against 25-50 s modules)."""


def split(nodeid: str) -> bool:
    return _module(nodeid) in SPLIT_RAY_MODULES


def under_ray_folder(nodeid: str) -> bool:
    """The controller schedules node ids without collecting the tests, so the folder decides."""
    return RAY_FOLDER in _module(nodeid).parents


def multihost(scope: str) -> bool:
    return MULTIHOST_FOLDER in _module(scope).parents


def _module(nodeid: str) -> PurePosixPath:
    return PurePosixPath(nodeid.split("::", 1)[0])


def next_scope(queue: Sequence[str], elsewhere: Collection[Collection[str]]) -> str | None:
    """The first scope of `queue` that a worker may take, given the unfinished scopes that each other
    worker holds (`elsewhere`, one collection per worker); None: nothing yet, ask again when another
    worker finishes a test. `queue` is in schedule order (`queue_order`).

    Workers, not scopes, are counted: a worker holds the scope it runs and the next one it was sent
    (xdist sends ahead), and counting those two as two Ray workers kept the tail on one worker."""
    ray_workers = [w for w in elsewhere if any(under_ray_folder(s) for s in w)]
    others_left = any(not under_ray_folder(s) for s in queue)
    for scope in queue:
        if not under_ray_folder(scope):
            return scope
        if not ray_workers:
            return scope  # 2.: this worker runs the Ray modules (the multi-host ones first, 1.)
        if (not others_left and len(ray_workers) < MAX_RAY_WORKERS and not multihost(scope)
                and not any(multihost(s) for w in ray_workers for s in w)):
            return scope  # 3. and 4.
    return None


def queue_order(scopes: Sequence[str]) -> list[str]:
    """Multi-host modules, the other Ray modules, the split Ray modules' tests, then every other scope;
    each group in file order."""
    def group(scope: str) -> int:
        return 0 if multihost(scope) else 2 if split(scope) else 1 if under_ray_folder(scope) else 3
    return sorted(scopes, key=group)  # stable: file order within a group


class RayTestsTogether(LoadScopeScheduling):
    """xdist's `load` distribution with the scopes and the choice of this module's docstring. (xdist_group
    would not say it, and xdist 3.8 cannot rename pytest 9's node ids, so its groups silently split.)"""

    _ordered = False

    def _split_scope(self, nodeid: str) -> str:
        return str(_module(nodeid)) if under_ray_folder(nodeid) and not split(nodeid) else nodeid

    def _assign_work_unit(self, node: Any) -> None:
        if node not in self.registered_collections:
            return  # a worker that replaces a crashed one, still collecting: `schedule` offers it work then
        if not self._ordered:  # the first call (from `schedule`): the queue is complete, order it once
            self._ordered = True
            scopes = dict.fromkeys(self._split_scope(nodeid) for nodeid in self.collection or ())
            self.workqueue = OrderedDict((s, self.workqueue[s]) for s in queue_order(list(scopes)))
        elsewhere = [[scope for scope, tests in work.items() if not all(tests.values())]
                     for other, work in self.assigned_work.items() if other is not node]
        scope = next_scope(list(self.workqueue), elsewhere)
        if scope is None:
            return  # `mark_test_complete` offers it work again
        work_unit = self.workqueue.pop(scope)
        self.assigned_work.setdefault(node, {})[scope] = work_unit
        collection = self.registered_collections[node]
        node.send_runtest_some([collection.index(nodeid) for nodeid, done in work_unit.items() if not done])

    def mark_test_complete(self, node: Any, item_index: int, duration: float = 0) -> None:
        super().mark_test_complete(node, item_index, duration)
        # A worker that `next_scope` left waiting may take a scope now, or hear that none is left. (It
        # still holds its last test: an xdist worker runs a test once it knows the next, or at shutdown.)
        for other in list(self.assigned_work):
            if other is not node:
                self._reschedule(other)
