"""The package stays lint-clean and mypy-clean (STYLE.md: annotate every public signature)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_ruff_finds_nothing() -> None:
    run = subprocess.run([sys.executable, "-m", "ruff", "check", "."], check=False, cwd=ROOT,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.slow
def test_mypy_finds_nothing() -> None:
    run = subprocess.run([sys.executable, "-m", "mypy", "proto", "kernels", "node_agent", "cluster", "bench"],
                         check=False, cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
