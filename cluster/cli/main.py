"""The `radixmesh` console script: a thin click group; each subcommand parses, builds, and hands off.

Errors a user can fix (a bad --state, an unreachable Redis, unreadable TLS files) end as one line on
stderr and a non-zero exit.

Every option can also come from the environment, `RADIXMESH_<COMMAND>_<PARAMETER>` (e.g.
`RADIXMESH_UP_GPU_BLOCKS=2048`, `RADIXMESH_UP_LOCAL_NODES=3`, `RADIXMESH_LOG_LEVEL=DEBUG`; `--help`
names each one), or from `--config FILE`, a YAML
mapping of command to options (`up: {model: smollm2-135m-instruct, gpu-blocks: 2048}`). The command
line wins over the environment, which wins over the file.
"""

import importlib
import logging
from pathlib import Path

import click
import yaml

from radixmesh.cluster.launch import LOG_LEVELS

COMMANDS = {
    "up": "radixmesh.cluster.cli.cluster:up",
    "down": "radixmesh.cluster.cli.cluster:down",
    "route": "radixmesh.cluster.cli.inspect:route",
    "stats": "radixmesh.cluster.cli.inspect:stats",
    "bench": "radixmesh.cluster.cli.bench:bench",
    "bench-trace": "radixmesh.cluster.cli.bench_trace:bench_trace",
    "demo": "radixmesh.cluster.cli.demo:demo",
    "replay": "radixmesh.cluster.cli.replay:replay_command",
    "front": "radixmesh.cluster.cli.front:front",
    "sim": "radixmesh.cluster.cli.sim:sim",
    "metadata-server": "radixmesh.cluster.cli.metadata_server:metadata_server",
}
"""Each subcommand and where it lives: imported only when it runs (or `--help` lists them), so
`radixmesh stats` answers without first loading torch and Ray, which `up` needs."""


class LazyGroup(click.Group):
    """A click group whose subcommands are COMMANDS, imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module, name = COMMANDS[cmd_name].split(":")
        command: click.Command = getattr(importlib.import_module(module), name)
        for param in command.params:  # `--help` names each option's environment variable
            if isinstance(param, click.Option):
                param.show_envvar = True
        return command


def _load_config(ctx: click.Context, _: click.Parameter, path: Path | None) -> None:
    """Make the YAML file at `path` the commands' defaults (click's default_map)."""
    if path is None:
        return
    try:
        loaded = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise click.BadParameter(f"cannot read {path}: {e}") from None
    group = ctx.command
    assert isinstance(group, click.Group)
    if not isinstance(loaded, dict):
        raise click.BadParameter(f"{path} must map command names to their options")
    defaults: dict[str, dict[str, object]] = {}
    for name, options in loaded.items():
        command = group.get_command(ctx, str(name))
        if command is None or not isinstance(options, dict):
            raise click.BadParameter(f"{path}: {name!r} is not a command with options "
                                     f"(commands: {', '.join(group.list_commands(ctx))})")
        # Keys are the options as typed (`gpu-blocks` or `gpu_blocks` for --gpu-blocks), or their names.
        known = {opt.lstrip("-").replace("-", "_"): p.name for p in command.params if p.name
                 for opt in (*p.opts, p.name)}
        mine = defaults[str(name)] = {}
        for key, value in options.items():
            param = known.get(str(key).lstrip("-").replace("-", "_"))
            if param is None:
                raise click.BadParameter(f"{path}: `{name}` has no option {key!r}")
            mine[param] = value
    ctx.default_map = defaults


@click.group(cls=LazyGroup, context_settings={"auto_envvar_prefix": "RADIXMESH"})
@click.option("--config", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              is_eager=True, expose_value=False, callback=_load_config,
              help="YAML file of defaults per command, e.g. `up: {model: tiny, gpu-blocks: 2048}`.")
@click.option("--log-level", default="INFO", show_default=True, type=click.Choice(LOG_LEVELS, case_sensitive=False),
              help="Logging level of this process and, through ray.LoggingConfig, of every actor `up` starts.")
def main(log_level: str) -> None:
    """radixmesh: a distributed prefix KV-cache cluster for LLM serving."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
