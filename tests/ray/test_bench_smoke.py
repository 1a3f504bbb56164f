"""The smoke modes of the benchmarks that start a Ray head (see tests/bench/test_bench_smoke.py)."""

from pathlib import Path

import pytest

from tests.support.bench_scripts import RAY_SMOKES, run_smoke

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.mark.parametrize("name", sorted(RAY_SMOKES - {"gpu_cluster"}))
def test_bench_smoke(name: str, tmp_path: Path) -> None:
    run_smoke(name, tmp_path)


def test_gpu_cluster_smoke_serves_identical_tokens_through_a_pull(tmp_path: Path) -> None:
    """gpu_check's cluster step (bench/gpu_cluster.py) end to end on the CPU, with the tiny model: two
    agent actors, an uncached, a local and a pulled serve of each prompt, baselines measured."""
    [result] = run_smoke("gpu_cluster", tmp_path)
    assert result["model"] == "random-tiny" and result["trials"] == 2
    assert result["outputs_identical"] and result["pulls_failed"] == 0 and result["device"] == "cpu"
    assert all(r["pull_bytes"] > 0 for r in result["rows"])  # the pulled serve really pulled
    assert result["copy_gbps"] > 0 and result["pull_over_copy"] > 0 and result["decode_tokens_per_s"] > 0
    assert result["ttft_local_over_uncached"] > 0
