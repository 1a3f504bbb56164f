"""The suite's xdist schedule (tests/conftest.py): every module marked `ray` is one scope, so one
worker runs them one after another; every other test is a scope of its own."""

import pytest
from xdist_schedule import RayTestsTogether


@pytest.fixture
def schedule(pytestconfig: pytest.Config) -> RayTestsTogether:
    # Only the scope rule is under test: xdist's constructor wants the workers' spec, not needed here.
    s = RayTestsTogether.__new__(RayTestsTogether)
    s.config = pytestconfig
    return s


@pytest.mark.parametrize("nodeid", [
    "tests/multihost/test_ray_up_cluster.py::test_ray_up_brings_one_agent_per_worker_host",
    "tests/test_cli.py::test_up_route_stats_down_end_to_end",
    "tests/test_local_ray.py::test_a_second_init_is_refused[x]",
])
def test_modules_marked_ray_share_one_scope(schedule: RayTestsTogether, nodeid: str) -> None:
    assert schedule._split_scope(nodeid) == "ray"


@pytest.mark.parametrize("nodeid", [
    "tests/test_sim.py::test_anything",
    "tests/test_event_publisher.py::test_an_unexpected_error_is_counted_and_the_loops_go_on",
    "tests/test_xdist_schedule.py::test_modules_marked_ray_share_one_scope[x]",
])
def test_other_tests_are_scopes_of_their_own(schedule: RayTestsTogether, nodeid: str) -> None:
    assert schedule._split_scope(nodeid) == nodeid
