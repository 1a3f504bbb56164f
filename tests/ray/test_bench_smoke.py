"""The smoke modes of the benchmarks that start a Ray head (see tests/bench/test_bench_smoke.py)."""

from pathlib import Path

import pytest

from tests.support.bench_scripts import RAY_SMOKES, run_smoke

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.mark.parametrize("name", sorted(RAY_SMOKES))
def test_bench_smoke(name: str, tmp_path: Path) -> None:
    run_smoke(name, tmp_path)
