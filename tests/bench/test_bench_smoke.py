"""Every benchmark in bench/ runs its smoke mode (tiny sizes, seconds) in the suite, so none rots; those
that start a Ray head run from tests/ray/test_bench_smoke.py."""

from pathlib import Path

import pytest

from tests.support.bench_scripts import RAY_SMOKES, ROOT, SMOKED_ELSEWHERE, bench_scripts, run_smoke

pytestmark = pytest.mark.slow


def test_every_ray_smoke_is_a_benchmark() -> None:
    """A renamed or removed Ray benchmark cannot silently drop out of both lists."""
    assert RAY_SMOKES <= set(bench_scripts())


def test_every_smoke_run_elsewhere_is_a_benchmark_whose_test_runs_it() -> None:
    for name, test in SMOKED_ELSEWHERE.items():
        assert name in bench_scripts() and f"{name}.py" in (ROOT / test).read_text(), (name, test)


@pytest.mark.parametrize("name", [n for n in bench_scripts() if n not in RAY_SMOKES and n not in SMOKED_ELSEWHERE])
def test_bench_smoke(name: str, tmp_path: Path) -> None:
    run_smoke(name, tmp_path)
