"""The suite's xdist schedule (tests/support/xdist_schedule.py): every module under tests/ray/ is one
scope and every other test a scope of its own; one worker runs the Ray modules beside the other tests,
both do once only Ray modules are left, and a multi-host module never runs beside another Ray module.
And the folder and the `ray` marker agree: a module that starts a Ray head outside tests/ray/ would run
beside the others."""

from collections import OrderedDict
from pathlib import Path

import pytest

from tests.support.xdist_schedule import (
    RayTestsTogether,
    multihost,
    next_scope,
    queue_order,
    under_ray_folder,
)

TESTS = Path(__file__).resolve().parent
RAY_MARK = "pytest.mark." + "ray"  # spelt so that this module does not carry it

MH = "tests/ray/multihost/test_ray_up_cluster.py"
CLI, LOCAL, AGENT = "tests/ray/test_cli.py", "tests/ray/test_local_ray.py", "tests/ray/test_agent_ray.py"
SIM, ROUTER = "tests/cluster/sim/test_sim.py::test_a", "tests/cluster/router/test_router.py::test_b"
SMOKE_A, SMOKE_B = "tests/ray/test_bench_smoke.py::test_bench_smoke[chaos]", "tests/ray/test_bench_smoke.py::test_bench_smoke[overload]"


@pytest.fixture
def schedule(pytestconfig: pytest.Config) -> RayTestsTogether:
    # Only the scope rule is under test: xdist's constructor wants the workers' spec, not needed here.
    s = RayTestsTogether.__new__(RayTestsTogether)
    s.config = pytestconfig
    return s


@pytest.mark.parametrize(("nodeid", "scope"), [
    (f"{MH}::test_ray_up_brings_one_agent_per_worker_host", MH),
    (f"{CLI}::test_up_route_stats_down_end_to_end", CLI),
    (f"{LOCAL}::test_a_second_init_is_refused[x]", LOCAL),
])
def test_a_ray_module_is_one_scope(schedule: RayTestsTogether, nodeid: str, scope: str) -> None:
    assert schedule._split_scope(nodeid) == scope


@pytest.mark.parametrize("nodeid", [
    "tests/cluster/sim/test_sim.py::test_anything",
    "tests/common/metadata/test_event_publisher.py::test_an_unexpected_error_is_counted_and_the_loops_go_on",
    "tests/test_xdist_schedule.py::test_a_ray_module_is_one_scope[x]",
    "tests/cluster/test_ray.py::test_a_name_that_mentions_ray",
    "tests/raymond/test_x.py::test_a_folder_that_starts_with_ray",
])
def test_other_tests_are_scopes_of_their_own(schedule: RayTestsTogether, nodeid: str) -> None:
    assert schedule._split_scope(nodeid) == nodeid
    assert not under_ray_folder(nodeid)


def test_multihost_modules_then_other_ray_modules_then_the_rest_each_in_file_order() -> None:
    assert queue_order([SIM, CLI, MH, ROUTER, LOCAL]) == [MH, CLI, LOCAL, SIM, ROUTER]
    assert multihost(MH) and not multihost(CLI)


def test_a_split_ray_modules_tests_are_scopes_of_their_own_queued_after_the_other_ray_modules(
        schedule: RayTestsTogether) -> None:
    assert [schedule._split_scope(n) for n in (SMOKE_A, SMOKE_B)] == [SMOKE_A, SMOKE_B]
    assert under_ray_folder(SMOKE_A)  # still Ray scopes: the one-worker and two-worker rules hold
    assert queue_order([SIM, SMOKE_A, CLI, SMOKE_B, MH]) == [MH, CLI, SMOKE_A, SMOKE_B, SIM]
    assert next_scope([SMOKE_B, SIM], [[SMOKE_A]]) == SIM  # while other tests are left, one Ray worker
    assert next_scope([SMOKE_B], [[SMOKE_A]]) == SMOKE_B  # the tail: both


@pytest.mark.parametrize(("queue", "elsewhere", "taken"), [
    ([MH, CLI, SIM], [], MH),  # no Ray module runs: this worker takes them, the multi-host one first
    ([CLI, LOCAL, SIM], [[ROUTER]], CLI),  # another worker's plain test does not matter
    ([CLI, LOCAL, SIM, ROUTER], [[MH]], SIM),  # the other worker runs the Ray modules: the rest here
    ([CLI, LOCAL, SIM], [[LOCAL]], SIM),
    ([CLI, LOCAL], [[LOCAL]], CLI),  # only Ray modules left: the tail runs on both workers
    ([CLI], [[LOCAL, AGENT]], CLI),  # one worker running one Ray module and sent the next is one worker
    ([CLI, LOCAL], [[MH]], None),  # never beside the multi-host module: wait
    ([MH, CLI], [[LOCAL]], CLI),
    ([MH], [[LOCAL]], None),  # the multi-host module never beside another Ray module
    ([CLI], [[LOCAL], [AGENT]], None),  # two Ray workers at most
    ([], [[LOCAL]], None),
])
def test_next_scope(queue: list[str], elsewhere: list[list[str]], taken: str | None) -> None:
    assert next_scope(queue, elsewhere) == taken


class FakeWorker:
    """What the scheduler sees of an xdist worker: the test indexes it was sent, in order."""

    def __init__(self, name: str) -> None:
        self.name, self.sent, self.shutting_down = name, list[int](), False
        self.gateway = type("Gateway", (), {"id": name})()

    def send_runtest_some(self, indexes: list[int]) -> None:
        self.sent += indexes

    def shutdown(self) -> None:
        self.shutting_down = True


def two_worker_scheduler() -> RayTestsTogether:
    """The scheduler as xdist builds it for `-n 2`, without the workers' spec its constructor wants."""
    s = RayTestsTogether.__new__(RayTestsTogether)
    s.numnodes, s.collection, s.workqueue, s.assigned_work, s.registered_collections = 2, None, OrderedDict(), {}, {}
    s.log = lambda *_: None
    s.config = pytest.Config.__new__(pytest.Config)
    s.config.option = type("Options", (), {"loadscopereorder": True})()
    return s


def play(collection: list[str], cost: dict[str, int]) -> dict[str, list[tuple[int, str]]]:
    """xdist's calls to the scheduler for two workers, played out in time: a test of module m takes
    cost[m] ticks (1 if absent); each worker runs what it was sent, in order, a test once it holds the
    next one too (to tear down towards it) or at shutdown, as xdist's workers do. (start tick, node id)
    per worker; asserts 4. whenever a test starts."""
    s = two_worker_scheduler()
    workers = [FakeWorker("gw0"), FakeWorker("gw1")]
    for w in workers:
        s.add_node(w)
        s.add_node_collection(w, collection)
    s.schedule()
    ran: dict[str, list[tuple[int, str]]] = {w.name: [] for w in workers}
    running: dict[str, tuple[int, str] | None] = {w.name: None for w in workers}  # (ends at, node id)
    now = 0
    while not all(w.shutting_down and running[w.name] is None and len(ran[w.name]) == len(w.sent) for w in workers):
        for w in workers:  # an idle worker starts a test once it holds the next one too, or at shutdown
            held = len(w.sent) - len(ran[w.name])
            if running[w.name] is None and (held >= 2 or (held == 1 and w.shutting_down)):
                nodeid = collection[w.sent[len(ran[w.name])]]
                module = nodeid.split("::")[0]
                [(_, other)] = [(n, r) for n, r in running.items() if n != w.name]
                if under_ray_folder(module) and other is not None and under_ray_folder(other[1]):
                    assert not multihost(module) and not multihost(other[1]), (nodeid, other)
                ran[w.name].append((now, nodeid))
                running[w.name] = (now + cost.get(module, 1), nodeid)
        assert any(running.values()), "both workers wait: the schedule is stuck"
        now = min(r[0] for r in running.values() if r is not None)
        for w in workers:  # finish what ends now
            r = running[w.name]
            if r is not None and r[0] == now:
                running[w.name] = None
                s.mark_test_complete(w, collection.index(r[1]))
    assert sorted(n for runs in ran.values() for _, n in runs) == sorted(collection)  # every test once
    return ran


RAY = [f"{MH}::test_{i}" for i in range(3)] + [f"{CLI}::test_{i}" for i in range(3)] + \
      [f"{LOCAL}::test_{i}" for i in range(4)]
COST = {MH: 5, CLI: 3, LOCAL: 3}


def test_one_worker_runs_the_ray_modules_while_the_other_runs_the_rest() -> None:
    plain = [f"tests/cluster/test_p.py::test_{i}" for i in range(60)]
    ran = play(plain[:30] + RAY[3:] + plain[30:] + RAY[:3], COST)  # collected in file order, not schedule order
    assert [n for _, n in ran["gw0"]][:10] == RAY  # 1. and 2., in the order of 1.
    assert not any(under_ray_folder(n) for _, n in ran["gw1"])


def test_once_only_ray_modules_are_left_both_workers_run_them_but_never_beside_multihost() -> None:
    plain = [f"tests/cluster/test_p.py::test_{i}" for i in range(4)]
    ran = play(plain + RAY, COST)
    gw1_ray = [(t, n) for t, n in ran["gw1"] if under_ray_folder(n)]
    assert gw1_ray and all(not multihost(n) for _, n in gw1_ray)  # 3.: the tail
    multihost_done = max(t for t, n in ran["gw0"] if multihost(n)) + COST[MH]
    assert min(t for t, _ in gw1_ray) >= multihost_done  # 4.: gw1 waited for it


def test_modules_marked_ray_are_exactly_those_under_tests_ray() -> None:
    modules = sorted(TESTS.rglob("test_*.py"))
    marked = {p.relative_to(TESTS).as_posix() for p in modules if RAY_MARK in p.read_text()}
    in_ray = {p.relative_to(TESTS).as_posix() for p in modules if p.is_relative_to(TESTS / "ray")}
    assert "ray/test_cli.py" in in_ray  # the glob found the folder
    assert marked == in_ray


def test_the_tail_starts_on_the_second_worker_as_soon_as_its_other_tests_are_done() -> None:
    # gw0 runs a long chain of Ray modules and always holds the next one too (xdist sends ahead);
    # gw1 must join the chain right after its last plain test, not once gw0 holds a single module.
    chain = [f"tests/ray/test_m{i}.py::test_{j}" for i in range(8) for j in range(2)]
    plain = [f"tests/cluster/test_p.py::test_{i}" for i in range(10)]
    ran = play(chain + plain, {f"tests/ray/test_m{i}.py": 5 for i in range(8)})
    plain_done = max(t for t, n in ran["gw1"] if not under_ray_folder(n)) + 1
    first_ray = min(t for t, n in ran["gw1"] if under_ray_folder(n))
    assert first_ray - plain_done <= 10  # at most gw1's one held test's wait, never gw0's whole chain


def test_a_worker_that_replaces_a_crashed_one_gets_work_once_it_has_collected() -> None:
    # xdist adds the replacement at once and registers its collection later; a test completing on
    # the other worker in between offered the replacement work and raised KeyError (an INTERNALERROR
    # that ended a CI run).
    collection = [f"tests/cluster/test_p.py::test_{i}" for i in range(12)]
    s = two_worker_scheduler()
    gw0, gw1, gw2 = FakeWorker("gw0"), FakeWorker("gw1"), FakeWorker("gw2")
    for w in (gw0, gw1):
        s.add_node(w)
        s.add_node_collection(w, collection)
    s.schedule()
    crashed_on = collection[gw1.sent[0]]
    assert s.remove_node(gw1) == crashed_on  # its unfinished tests go back to the queue
    s.add_node(gw2)
    s.mark_test_complete(gw0, gw0.sent[0])
    assert gw2.sent == []
    s.add_node_collection(gw2, collection)
    s.schedule()
    assert gw2.sent  # work once collected
    s.mark_test_complete(gw0, gw0.sent[1])
    handed = [collection[i] for i in gw0.sent + gw2.sent]
    assert crashed_on in handed or crashed_on in s.workqueue  # its scope is handed on, not lost
