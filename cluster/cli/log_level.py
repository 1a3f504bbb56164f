"""The `--log-level` of the `radixmesh` group, for commands that start Ray actors (their job's
ray.LoggingConfig: LauncherConfig.log_level)."""

import click


def chosen_log_level() -> str:
    """The group's --log-level; INFO when the command runs outside the group (a test's CliRunner)."""
    return str(click.get_current_context().find_root().params.get("log_level", "INFO"))
