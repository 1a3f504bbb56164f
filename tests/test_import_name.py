"""The project is importable only as `radixmesh.*` (radixmesh/import_name.py): a process started in the
repository root, as README starts the suite, finds third-party packages named like the top-level
folders (Hugging Face's `kernels`, which transformers imports; anyone's `common`, `proto`, `cluster`),
and a bare name with no such package fails as if the folder were not there."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("kernels", "common", "proto", "cluster", "node_agent")

pytestmark = pytest.mark.slow

PROBE = textwrap.dedent('''
    import importlib
    import os
    import sys

    def test_bare_names() -> None:
        assert os.getcwd() == {root!r}
        assert any(p in ("", {root!r}) for p in sys.path), sys.path  # the root does sit on sys.path
        stand_ins = os.environ.get("STAND_INS")
        for name in {folders!r}:
            if stand_ins:
                module = importlib.import_module(name)
                assert module.WHO == "stand-in", (name, module.__file__)
                assert importlib.import_module(name + ".sub").WHO == "stand-in sub"
            else:
                try:
                    importlib.import_module(name)
                except ModuleNotFoundError as e:
                    assert "importable only as radixmesh." + name in str(e)
                else:  # installed in the venv: Hugging Face's kernels, proto-plus's proto
                    assert not sys.modules[name].__file__.startswith({root!r} + "/" + name + "/"), name

    def test_transformers_hub_kernels() -> None:
        if os.environ.get("STAND_INS"):
            return  # the stand-in `kernels` is not Hugging Face's
        from transformers.integrations import hub_kernels
        import kernels
        assert hub_kernels is not None and not kernels.__file__.startswith({root!r} + "/kernels/")

    def test_radixmesh_still_imports() -> None:
        from radixmesh.kernels.ops import write_kv
        from radixmesh.node_agent import AgentConfig
        import radixmesh.common.secret, radixmesh.proto.ids, radixmesh.cluster
        assert write_kv and AgentConfig
''')


def _run_probe(tmp_path: Path, stand_ins: Path | None) -> subprocess.CompletedProcess[str]:
    probe = tmp_path / "probe" / "test_probe.py"
    probe.parent.mkdir()
    probe.write_text(PROBE.format(root=str(ROOT), folders=FOLDERS))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS", "STAND_INS")}
    if stand_ins is not None:
        env["PYTHONPATH"] = str(stand_ins)  # after the root: `python -m` puts the working directory first
        env["STAND_INS"] = "1"
    # As README's test command: `python -m pytest -n N` from the repository root (xdist's workers add
    # the root to sys.path and PYTHONPATH as well).
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "1", str(probe)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240, check=False,
    )


def test_third_party_packages_win_from_the_repository_root(tmp_path: Path) -> None:
    site = tmp_path / "site"
    for name in FOLDERS:
        (site / name).mkdir(parents=True)
        (site / name / "__init__.py").write_text('WHO = "stand-in"\n')
        (site / name / "sub.py").write_text('WHO = "stand-in sub"\n')
    run = _run_probe(tmp_path, site)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "3 passed" in run.stdout, run.stdout


def test_bare_names_fail_and_hugging_face_kernels_loads(tmp_path: Path) -> None:
    run = _run_probe(tmp_path, None)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "3 passed" in run.stdout, run.stdout
