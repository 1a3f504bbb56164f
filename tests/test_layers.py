"""The import contracts in pyproject.toml ([tool.importlinter]) hold, and they can fail."""

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("proto", "kernels", "common", "node_agent", "cluster")
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
    # torch stays out of the processes that only describe agents (the router, the metadata service,
    # `up`): tests/cluster/launch/test_torch_free.py.
    ("node_agent/actor.py", "radixmesh.node_agent.agent"),
    ("node_agent/model/modeled/spec.py", "radixmesh.node_agent.model.modeled.forward"),
    ("node_agent/model/source.py", "radixmesh.node_agent.model.gguf"),
    ("node_agent/model/source.py", "radixmesh.node_agent.model.llama"),
    ("node_agent/model/source.py", "radixmesh.node_agent.model.weights"),
}
# node_agent's public face (node_agent/__init__.py) loads its names on first use, so a command that
# needs a model name does not import torch; its `if TYPE_CHECKING:` imports give static tools
# the names' types.
FACE = ROOT / "node_agent" / "__init__.py"


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


def lint_with_import(tmp_path: Path, module: str, imported: str) -> str:
    """lint-imports' report on a copy of the package where `module` (a path under radixmesh/) also
    imports `imported`."""
    # A copy laid out as the installed namespace package: tmp_path/radixmesh/{proto,...}. PathFinder
    # runs before the editable install's finder, so with tmp_path on PYTHONPATH radixmesh.proto & co.
    # resolve to the copy.
    for name in PACKAGES:
        shutil.copytree(ROOT / name, tmp_path / "radixmesh" / name,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    with (tmp_path / "radixmesh" / module).open("a") as f:
        f.write(f"\nimport {imported}  # noqa: E402,F401\n")
    run = lint_imports(tmp_path, pythonpath=tmp_path)
    assert run.returncode != 0, run.stdout + run.stderr
    return run.stdout + run.stderr


def test_a_back_import_breaks_the_layers(tmp_path: Path) -> None:
    output = lint_with_import(tmp_path, "proto/ids.py", "radixmesh.cluster")
    assert "radixmesh: cluster > node_agent > common | kernels > proto BROKEN" in output, output
    assert "radixmesh.proto.ids -> radixmesh.cluster" in output, output


def test_the_shared_layer_cannot_reach_up(tmp_path: Path) -> None:
    output = lint_with_import(tmp_path, "common/block_pool/recall.py", "radixmesh.node_agent.memory.tiers")
    assert "radixmesh: cluster > node_agent > common | kernels > proto BROKEN" in output, output
    assert "radixmesh.common.block_pool.recall -> radixmesh.node_agent.memory.tiers" in output, output


def test_the_cache_core_loads_neither_torch_nor_the_node_agent() -> None:
    # Why the pool and the prefix cache live in common: the simulator runs them without the engine.
    code = ("import sys, radixmesh.common.prefix_cache.block_table, radixmesh.common.block_pool.recall, "
            "radixmesh.cluster.sim.simulator\n"
            "print(sorted(m for m in ('torch', 'radixmesh.node_agent') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[-1] == "[]"


def test_the_router_cannot_import_node_agent(tmp_path: Path) -> None:
    output = lint_with_import(tmp_path, "cluster/router/router.py", "radixmesh.node_agent")
    assert "only cluster.launch, cluster.cli and cluster.bench import node_agent BROKEN" in output, output
    assert "radixmesh.cluster.router.router -> radixmesh.node_agent" in output, output


def test_the_launcher_imports_only_node_agents_public_face(tmp_path: Path) -> None:
    output = lint_with_import(tmp_path, "cluster/launch/launcher.py", "radixmesh.node_agent.memory.tiers")
    assert "cluster imports node_agent's public face only BROKEN" in output, output
    assert "radixmesh.cluster.launch.launcher -> radixmesh.node_agent.memory.tiers" in output, output
    assert "only cluster.launch, cluster.cli and cluster.bench import node_agent BROKEN" not in output, output


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
                if path != FACE:
                    hidden |= {(rel, m) for m in modules if m.split(".")[0] == "radixmesh" and id(node) not in top}
    assert hidden == DEFERRED_IMPORTS


def test_node_agents_public_face_names_what_it_loads() -> None:
    # The face's lazy table and its TYPE_CHECKING imports must agree, or a name would type-check
    # and fail at run time (or the reverse).
    import radixmesh.node_agent as face

    tree = ast.parse(FACE.read_text())
    typed = {(node.module, a.name) for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
             for a in node.names if node.module and node.module.startswith("radixmesh.node_agent.")}
    assert typed == {(f"radixmesh.node_agent.{home}", name) for name, home in face._HOMES.items()}
    assert sorted(face.__all__) == sorted(face._HOMES)
    for name in face.__all__:
        assert getattr(face, name) is not None
