"""The suite's xdist schedule, in a module of its own so that tests import it by a name no other
folder's conftest shares (`from conftest import ...` finds whichever conftest came first)."""

import functools
from pathlib import Path

from xdist.scheduler import LoadScopeScheduling


class RayTestsTogether(LoadScopeScheduling):
    """xdist's `load` distribution, except that every test of a module marked `ray` goes to one worker,
    in file order: two Ray heads at once (one spanning network namespaces) starve each other on two
    cores, and a module's cluster fixture is built once. (xdist_group would say this, but xdist 3.8
    cannot rename pytest 9's node ids, so its groups silently split.)"""

    def _split_scope(self, nodeid: str) -> str:
        return "ray" if _marked_ray(self.config.rootpath / nodeid.split("::", 1)[0]) else nodeid


@functools.cache
def _marked_ray(path: Path) -> bool:
    # The controller schedules node ids without collecting the tests, so it reads the module's marker.
    return path.suffix == ".py" and "pytest.mark.ray" in path.read_text()
