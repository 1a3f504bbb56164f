"""The levels `--log-level` and LauncherConfig.log_level accept: Python's logging names. A module of
its own so the CLI reads them without importing the launcher (and torch with it)."""

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
