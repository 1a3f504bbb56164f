"""bench/gpu_check.py on a box as bare as a lent GPU's: a virtualenv holding only torch, triton, numpy and
what they require (linked from this one), no ray, no grpc, nothing of radixmesh's own dependencies. Its
kernels and engine steps must run there on the four carried wheels alone, tell which they lack without
them, and its cluster step must skip, saying why. The wheels are zipped here from the installed
distributions: a wheel is a zip of a distribution's files, so the test needs no network."""

import importlib.metadata
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from tests.support.bench_scripts import BENCH, ROOT

pytestmark = pytest.mark.slow

SCRIPT = BENCH / "gpu_check.py"
ON_THE_BOX = ("torch", "triton", "numpy")
CARRIED = ("prometheus_client", "tokenizers", "gguf", "PyYAML")


def requirement_closure(roots: tuple[str, ...]) -> set[str]:
    """The installed distributions `roots` need, transitively (extras left out)."""
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        try:
            dist = importlib.metadata.distribution(todo.pop())
        except importlib.metadata.PackageNotFoundError:
            continue  # a requirement for another platform, not installed here
        name = dist.metadata["Name"]
        if name in seen:
            continue
        seen.add(name)
        todo += [re.split(r"[ ;<>=!~\[(]", r, maxsplit=1)[0] for r in dist.requires or [] if "extra ==" not in r]
    return seen


def top_level_entries(dist: importlib.metadata.Distribution) -> set[str]:
    """The site-packages entries (packages, modules, .libs folders, dist-info) a distribution installed."""
    return {Path(str(f)).parts[0] for f in dist.files or []
            if not str(f).startswith("..") and "__pycache__" not in str(f)}


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, set[str]]:
    """The bare box's python, and the distributions it holds."""
    root = tmp_path_factory.mktemp("box")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True, timeout=120)
    site = next((root / "venv").glob("lib/python*/site-packages"))
    dists = requirement_closure(ON_THE_BOX)
    for name in dists:
        dist = importlib.metadata.distribution(name)
        for entry in top_level_entries(dist):
            source = Path(str(dist.locate_file(entry)))
            if source.exists() and not (site / entry).exists():
                (site / entry).symlink_to(source)
    return root / "venv" / "bin" / "python", dists


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("wheels")
    for name in CARRIED:
        dist = importlib.metadata.distribution(name)
        with zipfile.ZipFile(folder / f"{name}-{dist.version}-py3-none-any.whl", "w") as z:
            for f in dist.files or []:
                path = Path(str(dist.locate_file(f)))
                if not str(f).startswith("..") and "__pycache__" not in str(f) and path.is_file():
                    z.write(path, str(f))
    return folder


def run_on_box(python: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(python), str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, timeout=240,
                          check=False)


def result(out: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((out / "gpu_check.json").read_text())
    return loaded


def test_the_box_lacks_ray_and_our_dependencies(box: tuple[Path, set[str]]) -> None:
    python, dists = box
    assert {"torch", "triton", "numpy"} <= dists and not dists & {"ray", "grpcio", "msgpack", *CARRIED}
    probe = subprocess.run([str(python), "-c", "import ray"], capture_output=True, text=True, timeout=60,
                           check=False)
    assert "No module named 'ray'" in probe.stderr


def test_kernels_and_engine_run_there_on_the_carried_wheels_alone(box: tuple[Path, set[str]], wheels: Path,
                                                                  tmp_path: Path) -> None:
    python, dists = box
    run = run_on_box(python, "--smoke", "--wheels", str(wheels), "--out", str(tmp_path))
    assert run.returncode == 0, run.stdout + run.stderr
    got = result(tmp_path)
    assert got["smoke"] and got["correct"], got["steps"]
    assert {name: s["status"] for name, s in got["steps"].items()} == {
        "kernels": "ok", "engine": "ok", "cluster": "skipped"}, got["steps"]
    assert set(got["environment"]["carried"]) == set(CARRIED)
    # Everything the engine step imported was on the box or carried.
    assert set(got["steps"]["engine"]["summary"]["imported"]) <= dists | set(CARRIED)


def test_without_the_wheels_the_engine_step_is_skipped_naming_what_to_carry(box: tuple[Path, set[str]],
                                                                             tmp_path: Path) -> None:
    python, _ = box
    run = run_on_box(python, "--smoke", "--steps", "engine", "--out", str(tmp_path))
    assert run.returncode == 0, run.stdout + run.stderr
    engine = result(tmp_path)["steps"]["engine"]
    assert engine["status"] == "skipped" and "--wheels" in engine["reason"]
    assert all(module in engine["reason"] for module in ("prometheus_client", "tokenizers", "gguf", "yaml"))


def test_without_ray_the_cluster_step_is_skipped_saying_why(box: tuple[Path, set[str]], tmp_path: Path) -> None:
    python, _ = box
    # The step's own process, as gpu_check starts it on a GPU box (the whole command needs CUDA).
    run = run_on_box(python, "--step", "cluster", "--step-out", str(tmp_path / "cluster.json"))
    assert run.returncode == 0, run.stdout + run.stderr
    cluster = json.loads((tmp_path / "cluster.json").read_text())
    assert cluster["status"] == "skipped" and "No module named 'ray'" in cluster["reason"]
