"""How every process of a deployment logs: one plain line per record, `time LEVEL logger: message`,
as the CLI's own lines read, at the deployment's level.

Not ray.LoggingConfig: its text format appends ~200 characters of Ray ids (job, worker, node, actor,
task) to every line, which buries the access log and the stats line a user reads. A worker setup
hook configures Python logging in each of the job's processes instead; the level travels in the
job's environment.
"""

import logging
import os
from pathlib import Path

LEVEL_ENV = "RADIXMESH_LOG_LEVEL"
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_worker() -> None:
    """Ray's worker_process_setup_hook: runs in every worker process of the job before its first task."""
    logging.basicConfig(level=os.environ.get(LEVEL_ENV, "INFO").upper(), format=FORMAT, force=True)


def runtime_env(level: str) -> dict[str, object]:
    """The job-level runtime_env that makes each of its actors log at `level` (actors' own env_vars,
    e.g. the agents' UCX settings, merge with these: Ray's rule for env_vars)."""
    return {"worker_process_setup_hook": f"{__name__}.configure_worker", "env_vars": {LEVEL_ENV: level.upper()}}


def logs_dir() -> Path | None:
    """Where this node's Ray writes its workers' logs (the session's logs folder); None without Ray."""
    try:
        from ray._private import worker  # no public API names the session folder

        node = worker._global_node
        return Path(node.get_logs_dir_path()) if node is not None else None
    except (ImportError, AttributeError):
        return None
