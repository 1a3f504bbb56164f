"""The suite's xdist schedule (tests/conftest.py): every test under tests/ray/ is one scope, so one
worker runs them one after another; every other test is a scope of its own. And the folder and the
`ray` marker agree: a module that starts a Ray head outside tests/ray/ would run beside the others."""

from pathlib import Path

import pytest

from tests.support.xdist_schedule import RayTestsTogether

TESTS = Path(__file__).resolve().parent
RAY_MARK = "pytest.mark." + "ray"  # spelt so that this module does not carry it


@pytest.fixture
def schedule(pytestconfig: pytest.Config) -> RayTestsTogether:
    # Only the scope rule is under test: xdist's constructor wants the workers' spec, not needed here.
    s = RayTestsTogether.__new__(RayTestsTogether)
    s.config = pytestconfig
    return s


@pytest.mark.parametrize("nodeid", [
    "tests/ray/multihost/test_ray_up_cluster.py::test_ray_up_brings_one_agent_per_worker_host",
    "tests/ray/test_cli.py::test_up_route_stats_down_end_to_end",
    "tests/ray/test_local_ray.py::test_a_second_init_is_refused[x]",
])
def test_tests_under_tests_ray_share_one_scope(schedule: RayTestsTogether, nodeid: str) -> None:
    assert schedule._split_scope(nodeid) == "ray"


@pytest.mark.parametrize("nodeid", [
    "tests/cluster/test_sim.py::test_anything",
    "tests/common/test_event_publisher.py::test_an_unexpected_error_is_counted_and_the_loops_go_on",
    "tests/test_xdist_schedule.py::test_tests_under_tests_ray_share_one_scope[x]",
    "tests/cluster/test_ray.py::test_a_name_that_mentions_ray",
    "tests/raymond/test_x.py::test_a_folder_that_starts_with_ray",
])
def test_other_tests_are_scopes_of_their_own(schedule: RayTestsTogether, nodeid: str) -> None:
    assert schedule._split_scope(nodeid) == nodeid


def test_modules_marked_ray_are_exactly_those_under_tests_ray() -> None:
    modules = sorted(TESTS.rglob("test_*.py"))
    marked = {p.relative_to(TESTS).as_posix() for p in modules if RAY_MARK in p.read_text()}
    in_ray = {p.relative_to(TESTS).as_posix() for p in modules if p.is_relative_to(TESTS / "ray")}
    assert "ray/test_cli.py" in in_ray  # the glob found the folder
    assert marked == in_ray
