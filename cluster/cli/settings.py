"""Where a command's settings come from besides its command line: `RADIXMESH_*` environment variables
and `--config FILE`. Imports nothing heavy: the group applies it before any subcommand's module runs.

One name per setting: an option's variable is `RADIXMESH_<COMMAND>_<FLAG>`, spelled after the flag the
user types (`up --model` -> RADIXMESH_UP_MODEL, `up --local` -> RADIXMESH_UP_LOCAL), never after the
Python parameter behind it. A `RADIXMESH_*` variable that names no setting is reported, with the
nearest real name, instead of being ignored in silence.
"""

import difflib
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

import click
import yaml

PREFIX = "RADIXMESH"

PROCESS_VARIABLES = {
    "RADIXMESH_HOME": "where `up` keeps its record, the secret and the Prometheus files (~/.radixmesh)",
    "RADIXMESH_SECRET": "the cluster secret, hex (instead of $RADIXMESH_HOME/secret)",
    "RADIXMESH_API_KEY": "the key `route`, `stats` and `up --api-key` use",
    "RADIXMESH_ADMIN_KEY": "`front --admin-key` (`up` derives its admin key from the secret: `radixmesh admin-key`)",
    "RADIXMESH_KERNELS": "torch or triton: force one kernel implementation",
    "RADIXMESH_COMPUTE_GROUP": "the agents' compute group (hosts that share a fabric)",
    "RADIXMESH_LOG_LEVEL": "--log-level of every command",
    "RADIXMESH_CONFIG": "--config of every command",
}
"""Variables read outside any one command's options (each documented where it is read)."""


def envvar_of(command: str, option: click.Option) -> str:
    """RADIXMESH_<COMMAND>_<FLAG> for `option` of `command`, after its longest flag (`--gpu-blocks`)."""
    flag = max((o for o in option.opts if o.startswith("--")), key=len, default=option.opts[0])
    return f"{PREFIX}_{command}_{flag.lstrip('-')}".replace("-", "_").upper()


def name_envvars(command_name: str, command: click.Command) -> None:
    """Give each option of `command` that has no variable of its own its flag-named one."""
    for param in command.params:
        if isinstance(param, click.Option) and param.envvar is None and param.name not in ("config", "log_level"):
            param.envvar = envvar_of(command_name, param)
            param.allow_from_autoenv = False  # click would also read RADIXMESH_<CMD>_<PARAMETER>: one name only
            param.show_envvar = True


def unknown_variables(environ: Mapping[str, str], command_name: str, command: click.Command,
                      commands: Iterable[str]) -> list[str]:
    """One line per `RADIXMESH_*` variable in `environ` that no setting reads, for a run of
    `command_name`. Another command's variables (RADIXMESH_BENCH_* during `up`) are not judged: that
    command is not loaded, and a shell may well export settings for several commands."""
    own = {p.envvar for p in command.params if isinstance(p, click.Option) and isinstance(p.envvar, str)}
    known = own | set(PROCESS_VARIABLES)
    mine = f"{PREFIX}_{command_name}_".replace("-", "_").upper()
    others = tuple(f"{PREFIX}_{c}_".replace("-", "_").upper() for c in commands if c != command_name)
    lines = []
    for name in sorted(environ):
        if not name.startswith(f"{PREFIX}_") or name in known:
            continue
        if name.startswith(others) and not name.startswith(mine):
            continue
        near = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
        hint = f"; did you mean {near[0]}?" if near else f" (`radixmesh {command_name} --help` names each variable)"
        lines.append(f"warning: {name} is not a radixmesh setting and is ignored{hint}")
    return lines


def warn_unknown_variables(command_name: str, command: click.Command, commands: Iterable[str]) -> None:
    for line in unknown_variables(os.environ, command_name, command, commands):
        click.echo(line, err=True)


def read_config(path: Path) -> dict[object, object]:
    """The YAML mapping in `path`; click.BadParameter naming the file when it is not one."""
    try:
        loaded = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise click.BadParameter(f"cannot read {path}: {e}") from None
    if not isinstance(loaded, dict):
        raise click.BadParameter(f"{path} must map command names to their options")
    return loaded


def command_defaults(path: Path, name: str, command: click.Command, options: object) -> dict[str, object]:
    """`options` (a mapping from the file at `path`) as `command`'s click defaults, keyed by parameter.
    Keys are the options as typed (`gpu-blocks` or `gpu_blocks` for --gpu-blocks), or their names."""
    if not isinstance(options, dict):
        raise click.BadParameter(f"{path}: {name!r} is not a command with options")
    known = {opt.lstrip("-").replace("-", "_"): p.name for p in command.params if p.name
             for opt in (*p.opts, p.name)}
    out: dict[str, object] = {}
    for key, value in options.items():
        param = known.get(str(key).lstrip("-").replace("-", "_"))
        if param is None:
            raise click.BadParameter(f"{path}: `{name}` has no option {key!r}")
        out[param] = value
    return out
