"""The wheels the engine step needs on a lent GPU box, which has torch, triton, numpy and pytest and no
network. The engine's own imports bring four small modules: prometheus_client (its metrics rendering),
tokenizers and gguf (the tokenizer type, through common/text) and yaml (gguf's). They are fetched here,
pinned to the versions this checkout is tested with, travel with the working tree, and are unpacked
there into a folder on the steps' PYTHONPATH: a wheel is a zip laid out as site-packages, so no pip is
needed. See docs/gpu_check.md.
"""

import importlib.metadata
import sys
import zipfile
from pathlib import Path

CARRIED = {"prometheus_client": "prometheus_client", "tokenizers": "tokenizers", "gguf": "gguf",
           "yaml": "PyYAML"}
"""Import name -> distribution of every module the engine step needs beyond torch, triton and numpy."""


def fetch_command(dest: Path) -> list[str]:
    """`pip download` of the carried wheels into `dest`: binary wheels only (nothing to build there),
    without their dependencies (those the import needs are listed here; the rest are never imported)."""
    pins = [f"{dist}=={importlib.metadata.version(dist)}" for dist in CARRIED.values()]
    return [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--dest", str(dest), *pins]


def unpack(wheels: Path, site: Path) -> dict[str, str]:
    """Every wheel in `wheels` unpacked into `site`; {distribution: version}, read from the file names.
    ValueError when there is none."""
    found = sorted(wheels.glob("*.whl"))
    if not found:
        raise ValueError(f"no wheels in {wheels}: fetch them first (python bench/gpu_check.py --fetch-wheels DIR)")
    carried = {}
    for wheel in found:
        with zipfile.ZipFile(wheel) as z:
            z.extractall(site)
        name, version = wheel.name.split("-")[:2]  # PEP 427: {distribution}-{version}-...whl
        carried[name] = version
    return carried
