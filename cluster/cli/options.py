"""Options that several commands share, defined once: `--eviction` and `--handoff` (how the agents of a
command's deployment keep their prefix caches: LauncherConfig.eviction / .handoff), and the group's
`--log-level` as the commands that start Ray actors read it (their job's ray.LoggingConfig)."""

from collections.abc import Callable
from typing import TypeVar

import click

from radixmesh.common.cache_sharing import DEFAULT_HANDOFF
from radixmesh.node_agent import DEFAULT_EVICTION, EVICTION_ORDERS

F = TypeVar("F", bound=Callable[..., object])


def cache_options(command: F) -> F:
    """Add `eviction: str` and `handoff: bool` parameters to a click command."""
    command = click.option(
        "--handoff/--no-handoff", default=DEFAULT_HANDOFF, show_default=True,
        help="Agents evict first the blocks a peer just pulled from them (one copy of a moved conversation).",
    )(command)
    return click.option(
        "--eviction", type=click.Choice(sorted(EVICTION_ORDERS)), default=DEFAULT_EVICTION, show_default=True,
        help="Which cached blocks agents evict first (PoolConfig.eviction).",
    )(command)


def chosen_log_level() -> str:
    """The group's --log-level; INFO when the command runs outside the group (a test's CliRunner)."""
    return str(click.get_current_context().find_root().params.get("log_level", "INFO"))
