"""A Ray head that cannot start is reported with its GCS log and leaves no process behind."""

import psutil
import pytest
import ray

from radixmesh.cluster.launch.local_ray import init_loopback_ray

pytestmark = pytest.mark.ray


def test_head_that_never_starts_raises_with_gcs_log_and_leaks_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # No wait at all for the GCS port file: both tries fail the way a far too slow GCS does.
    monkeypatch.setenv("RAY_gcs_server_port_wait_time_s", "0")
    before = {child.pid for child in psutil.Process().children(recursive=True)}
    with pytest.raises(RuntimeError, match="Ray's head did not start") as failure:
        init_loopback_ray(num_cpus=1, log_to_driver=False)
    assert "/logs" in str(failure.value)  # where the GCS log is (its tail once the GCS wrote one)
    assert not ray.is_initialized()
    left = [child for child in psutil.Process().children(recursive=True) if child.pid not in before]
    assert left == []


def test_second_init_is_refused_without_stopping_the_running_head() -> None:
    init_loopback_ray(num_cpus=1, log_to_driver=False)
    try:
        with pytest.raises(RuntimeError, match="already initialized"):
            init_loopback_ray(num_cpus=1, log_to_driver=False)
        assert ray.is_initialized()
        assert ray.get(ray.put(41)) + 1 == 42
    finally:
        ray.shutdown()


def test_a_raylet_that_registers_late_gets_one_more_try(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray gives its raylet a fixed 30 s to register, then raises a plain Exception: on a busy box that
    is load, so the head is stopped and started once more, as for a GCS that did not start."""
    real_init = ray.init
    calls: list[str] = []

    def late_once(*args: object, **kwargs: object) -> object:
        calls.append("init")
        if len(calls) == 1:
            raise Exception("The current node timed out during startup. This could happen because ...")  # noqa: TRY002 (what Ray raises)
        return real_init(*args, **kwargs)

    monkeypatch.setattr(ray, "init", late_once)
    init_loopback_ray(num_cpus=1, log_to_driver=False)
    try:
        assert calls == ["init", "init"] and ray.get(ray.put(41)) + 1 == 42
    finally:
        ray.shutdown()


def test_any_other_failure_is_raised_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def broken(*args: object, **kwargs: object) -> None:
        calls.append("init")
        raise ValueError("bad argument")

    monkeypatch.setattr(ray, "init", broken)
    with pytest.raises(ValueError, match="bad argument"):
        init_loopback_ray(num_cpus=1, log_to_driver=False)
    assert calls == ["init"] and not ray.is_initialized()
