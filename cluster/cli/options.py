"""Options that several commands share, defined once: `--eviction` and `--handoff` (how the agents of a
command's deployment keep their prefix caches: LauncherConfig.eviction / .handoff), `--engine` and
`--speedup` (the real model or a modeled one: LauncherConfig.modeled), and the group's `--log-level`
as the commands that start Ray actors read it (their job's runtime_env: launch/worker_logging.py),
and `ByteSize`, the one way a size is written on the command line (`--host-cache 4GiB`)."""

import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import click
from click.core import ParameterSource

from radixmesh.common.block_pool.eviction import DEFAULT_EVICTION, DEFAULT_HANDOFF, EVICTION_ORDERS
from radixmesh.node_agent import (
    ModeledEngine,
    ModelSource,
    parse_engine,
    profile_names,
    resolve_model,
)

F = TypeVar("F", bound=Callable[..., object])

_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([A-Za-z]+)\s*")
SIZE_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40,
              "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
"""Units a size takes (SGLang's --hicache-size and LMCache's max_local_cpu_size are in GB; GiB is
what a pool's memory is counted in). A unit is required: a bare "4" could mean bytes or GiB."""


class ByteSize(click.ParamType):
    """A size in bytes written as a number and a unit: 4GiB, 512MiB, 1.5GB (case of the unit as in
    SIZE_UNITS, or all lower case); at least one byte."""

    name = "size"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        match = _SIZE.fullmatch(str(value))
        units = {**SIZE_UNITS, **{u.lower(): n for u, n in SIZE_UNITS.items()}}
        if match is None or match[2] not in units:
            self.fail(f"{value!r} is not a size: write a number and a unit, e.g. 4GiB, 512MiB or 1.5GB "
                      f"(units: {', '.join(SIZE_UNITS)})", param, ctx)
        size = float(match[1]) * units[match[2]]
        if not (math.isfinite(size) and size >= 1):
            self.fail(f"{value!r} is less than one byte", param, ctx)
        return int(size)


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


def given(*names: str) -> list[str]:
    """Which of the current command's parameters `names` the user set (on the command line or from its
    environment variable) rather than left at their defaults."""
    ctx = click.get_current_context()
    return [n for n in names if ctx.get_parameter_source(n) not in (ParameterSource.DEFAULT, None)]


def chosen_log_level() -> str:
    """The group's --log-level; INFO when the command runs outside the group (a test's CliRunner)."""
    return str(click.get_current_context().find_root().params.get("log_level", "INFO"))


def engine_options(command: F) -> F:
    """Add `engine: str` and `speedup: float` parameters to a click command (resolve with `chosen_engine`)."""
    command = click.option(
        "--speedup", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True,
        help="With --engine modeled: modeled seconds per wall second (steps and pull wire times alike).",
    )(command)
    return click.option(
        "--engine", default="real", show_default=True,
        help="real (the model computes), or modeled[:PROFILE]: the agents' real pool, cache, scheduler, events "
             "and pulls, with the forward replaced by a GPU time model (PROFILE: "
             f"{', '.join(profile_names())}, or a .yaml file). Its figures are labelled modeled:PROFILE.",
    )(command)


def chosen_engine(engine: str, speedup: float, model_spec: str) -> tuple[ModeledEngine | None, ModelSource]:
    """The modeled engine `engine` names (None: real) and the agents' model. A modeled profile serves its
    own model: --model may name it or be left out, never another one. click.UsageError when invalid."""
    try:
        modeled = parse_engine(engine, speedup)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    if modeled is not None:
        if given("model_spec") and model_spec != modeled.profile.model:
            raise click.UsageError(f"--engine {modeled.label} models {modeled.profile.model}; leave out --model "
                                   f"{model_spec} or pick a profile of it")
        model_spec = modeled.profile.model
    try:
        return modeled, resolve_model(model_spec)
    except ValueError as e:
        raise click.UsageError(str(e)) from None


def chosen_gpu_blocks(gpu_blocks: int | None, modeled: ModeledEngine | None, block_size: int) -> int:
    """--gpu-blocks, else the modeled profile's device (its kv_capacity_tokens), else 1024."""
    if gpu_blocks is not None:
        return gpu_blocks
    return modeled.gpu_blocks(block_size) if modeled is not None else DEFAULT_GPU_BLOCKS


DEFAULT_GPU_BLOCKS = 1024


def check_tls_choice(tls_cert: Path | None, tls_key: Path | None, tls_dir: Path | None, no_tls: bool) -> None:
    """The TLS options of a command that serves (`up`, `front`): a certificate comes with its key, and
    given files, a CA to mint from (`--tls-dir`) and plain text (`--no-tls`) exclude each other.
    ValueError naming the options."""
    if (tls_cert is None) != (tls_key is None):
        raise ValueError("--tls-cert and --tls-key go together")
    if sum((tls_cert is not None, tls_dir is not None, no_tls)) > 1:
        raise ValueError("--tls-cert/--tls-key, --tls-dir and --no-tls exclude each other")
