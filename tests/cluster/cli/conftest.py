"""The CLI tests' home: $RADIXMESH_HOME in the test's tmp_path, and no other RADIXMESH_* variable of the
environment the suite runs in (each is an option's default, `cluster/cli/settings.py`)."""

import os
from pathlib import Path

import pytest


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RADIXMESH_HOME", str(tmp_path))
    for name in [n for n in os.environ if n.startswith("RADIXMESH_") and n != "RADIXMESH_HOME"]:
        monkeypatch.delenv(name)
    return tmp_path
