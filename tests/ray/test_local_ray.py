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
