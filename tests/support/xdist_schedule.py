"""The suite's xdist schedule (tests/conftest.py's `pytest_xdist_make_scheduler`)."""

from pathlib import PurePosixPath

from xdist.scheduler import LoadScopeScheduling

RAY_FOLDER = PurePosixPath("tests/ray")
"""Every module that starts a Ray head lives under this folder (node ids are relative to the rootdir)."""


class RayTestsTogether(LoadScopeScheduling):
    """xdist's `load` distribution, except that every test under tests/ray/ goes to one worker, in file
    order: two Ray heads at once (one spanning network namespaces) starve each other on two cores, and
    a module's cluster fixture is built once. (xdist_group would say this, but xdist 3.8 cannot rename
    pytest 9's node ids, so its groups silently split.)"""

    def _split_scope(self, nodeid: str) -> str:
        return "ray" if under_ray_folder(nodeid) else nodeid


def under_ray_folder(nodeid: str) -> bool:
    """The controller schedules node ids without collecting the tests, so the folder decides."""
    return RAY_FOLDER in PurePosixPath(nodeid.split("::", 1)[0]).parents
