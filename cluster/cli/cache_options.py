"""`--eviction` and `--handoff`: how the agents of a command's deployment keep their prefix caches
(LauncherConfig.eviction / .handoff), one definition for every command that starts agents."""

from collections.abc import Callable
from typing import TypeVar

import click

from radixmesh.node_agent.memory.eviction import DEFAULT_EVICTION, EVICTION_ORDERS

F = TypeVar("F", bound=Callable[..., object])


def cache_options(command: F) -> F:
    """Add `eviction: str` and `handoff: bool` parameters to a click command."""
    command = click.option(
        "--handoff/--no-handoff", default=False, show_default=True,
        help="Agents evict first the blocks a peer just pulled from them (one copy of a moved conversation).",
    )(command)
    return click.option(
        "--eviction", type=click.Choice(sorted(EVICTION_ORDERS)), default=DEFAULT_EVICTION, show_default=True,
        help="Which cached blocks agents evict first: lru, or s3fifo (blocks used once before blocks used again).",
    )(command)
