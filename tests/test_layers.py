"""The import contracts in pyproject.toml ([tool.importlinter]) hold, and they can fail."""

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("proto", "kernels", "node_agent", "cluster")
# `python -m importlinter.cli` has no __main__ guard and exits 0 without checking anything: run the
# console script that the test extra installs next to this interpreter.
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
# Imports of our own modules allowed below a module's top level, with why: @triton.jit binds compiled
# vs interpreted at import, so the Triton kernels load on first use (kernels/dispatch.py).
DEFERRED_IMPORTS = {
    ("kernels/dispatch.py", "radixmesh.kernels.block_copy_triton"),
    ("kernels/dispatch.py", "radixmesh.kernels.decode_attention_triton"),
    ("kernels/dispatch.py", "radixmesh.kernels.kv_write_triton"),
    ("kernels/dispatch.py", "radixmesh.kernels.prefill_attention_triton"),
}


def lint_imports(cwd: Path, pythonpath: Path | None = None) -> subprocess.CompletedProcess[str]:
    assert LINT_IMPORTS.is_file(), f"no {LINT_IMPORTS}: install the test extra (it brings import-linter)"
    # Wide columns keep each contract's name on one line of the report.
    env = {**os.environ, "COLUMNS": "200"}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], check=False, cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=60)


def test_import_contracts_are_kept() -> None:
    run = lint_imports(ROOT)
    assert run.returncode == 0, run.stdout + run.stderr


def test_a_back_import_breaks_the_layers(tmp_path: Path) -> None:
    # A copy laid out as the installed namespace package: tmp_path/radixmesh/{proto,...}. PathFinder
    # runs before the editable install's finder, so with tmp_path on PYTHONPATH radixmesh.proto & co.
    # resolve to the copy.
    for name in PACKAGES:
        shutil.copytree(ROOT / name, tmp_path / "radixmesh" / name,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    with (tmp_path / "radixmesh" / "proto" / "ids.py").open("a") as f:
        f.write("\nimport radixmesh.cluster  # noqa: E402,F401\n")

    run = lint_imports(tmp_path, pythonpath=tmp_path)

    output = run.stdout + run.stderr
    assert run.returncode != 0, output
    assert "radixmesh: cluster > node_agent > kernels > proto BROKEN" in output, output
    assert "radixmesh.proto.ids -> radixmesh.cluster" in output, output


def test_no_import_of_ours_hides_below_the_top_level() -> None:
    # An import inside a function or under `if TYPE_CHECKING:` is how a module cycle hides.
    hidden = set()
    for name in PACKAGES:
        for path in sorted((ROOT / name).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            top = {id(node) for node in tree.body}
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    modules = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    modules = [node.module]
                else:
                    continue
                rel = path.relative_to(ROOT).as_posix()
                hidden |= {(rel, m) for m in modules if m.split(".")[0] == "radixmesh" and id(node) not in top}
    assert hidden == DEFERRED_IMPORTS
