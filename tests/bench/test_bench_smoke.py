"""Every benchmark in bench/ runs its smoke mode (tiny sizes, seconds) in the suite, so none rots; those
that start a Ray head run from tests/ray/test_bench_smoke.py."""

from pathlib import Path

import pytest

from tests.support.bench_scripts import RAY_SMOKES, bench_scripts, run_smoke

pytestmark = pytest.mark.slow


def test_every_ray_smoke_is_a_benchmark() -> None:
    """A renamed or removed Ray benchmark cannot silently drop out of both lists."""
    assert RAY_SMOKES <= set(bench_scripts())


@pytest.mark.parametrize("name", [n for n in bench_scripts() if n not in RAY_SMOKES])
def test_bench_smoke(name: str, tmp_path: Path) -> None:
    run_smoke(name, tmp_path)
