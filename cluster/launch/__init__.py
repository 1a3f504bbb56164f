"""Bringing a deployment up and down: launcher, config, loopback Ray, the metadata and router actors.

This module imports nothing, so the CLI reads LOG_LEVELS without importing the launcher (and torch
with it)."""

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
"""The levels `--log-level` and LauncherConfig.log_level accept: Python's logging names."""
