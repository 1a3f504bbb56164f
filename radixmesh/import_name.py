"""The project's one import name: the code of `radixmesh.<part>` lives in the repository's top-level
folder `<part>/` (kernels/, common/, proto/, cluster/, node_agent/), and a process whose sys.path holds
the repository root (any `python -m ...` or script started there, pytest's rootdir, pytest-xdist's
workers and their children through PYTHONPATH) would otherwise find those folders as the top-level
packages `kernels`, `common`, ... ahead of any installed package of that name. Hugging Face ships one
named `kernels` that transformers imports; a user's own `common` or `proto` is as likely.

Each folder's `__init__.py` calls `step_aside(__name__)` first: imported as `radixmesh.<part>` it does
nothing; imported under its bare name it loads the package that name means everywhere else on sys.path
into its place, or fails as if the folder were not there. Python's import system takes what
sys.modules holds once a module has run, so the importer receives the other package.
"""

import importlib.machinery
import importlib.util
import sys
from pathlib import Path

PACKAGE = "radixmesh"
ROOT = Path(__file__).resolve().parent.parent
"""The repository root: the folder that holds the top-level code folders."""


def step_aside(name: str) -> None:
    """Called by each top-level folder's `__init__.py` with its `__name__`."""
    if name.startswith(f"{PACKAGE}."):
        return
    elsewhere = [p for p in sys.path if _resolved(p) != ROOT]
    spec = importlib.machinery.PathFinder.find_spec(name, elsewhere)
    if spec is None or spec.loader is None:
        # Nothing else has this name (or only namespace folders do, which never shadow a package).
        raise ModuleNotFoundError(
            f"No module named {name!r}: the repository's {name}/ folder is importable only as {PACKAGE}.{name}",
            name=name,
        )
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise


def _resolved(entry: str) -> Path | None:
    try:
        return Path(entry or ".").resolve()
    except OSError:  # an entry that cannot be resolved is not the repository root
        return None
