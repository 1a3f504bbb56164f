"""The `radixmesh` console script: a thin click group; each subcommand parses, builds, and hands off.

Errors a user can fix (a bad --state, an unreachable Redis, unreadable TLS files) end as one line on
stderr and a non-zero exit.

Every option can also come from the environment, `RADIXMESH_<COMMAND>_<FLAG>` (e.g.
`RADIXMESH_UP_GPU_BLOCKS=2048`, `RADIXMESH_UP_LOCAL=3`, `RADIXMESH_LOG_LEVEL=DEBUG`; `--help`
names each one; an unknown `RADIXMESH_*` variable is reported), or from `--config FILE`, a YAML
mapping of command to options (`up: {model: smollm2-135m-instruct, gpu-blocks: 2048}`). The command
line wins over the environment, which wins over the file. `--config`, `--log-level`, `--version` and
`-h` work before the command and after it alike (`radixmesh up --config f.yaml`).
"""

import importlib
import logging
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import click

from radixmesh.cluster.cli import settings
from radixmesh.cluster.launch import LOG_LEVELS

COMMANDS = {
    "up": ("radixmesh.cluster.cli.up_down:up",
           "Start metadata service, node agents and router; print the router URL."),
    "down": ("radixmesh.cluster.cli.up_down:down",
             "Stop the recorded deployment (nothing to stop is not an error)."),
    "admin-key": ("radixmesh.cluster.cli.keys:admin_key_command",
                  "Print the router's admin key, derived from the cluster secret."),
    "ca-cert": ("radixmesh.cluster.cli.keys:ca_cert_command",
                "Print the cluster CA's certificate (PEM), derived from the cluster secret."),
    "kv-events-keys": ("radixmesh.cluster.cli.keys:kv_events_keys_command",
                       "Print the CURVE keys of the agents' tcp KV-events sockets (from the secret)."),
    "ray-tls": ("radixmesh.cluster.cli.keys:ray_tls_command",
                "Print the environment of Ray's mutual TLS, minting this host's certificate (from the secret)."),
    "route": ("radixmesh.cluster.cli.route_stats:route", "Serve PROMPT once and print where it went and why."),
    "stats": ("radixmesh.cluster.cli.route_stats:stats", "The cluster table: global hit rate by source, per-node hits."),
    "bench": ("radixmesh.cluster.cli.bench:bench",
              "Compare the arms on live clusters: goodput and latency against offered load."),
    "bench-trace": ("radixmesh.cluster.cli.bench_trace:bench_trace",
                    "Write a seeded bench workload as a Mooncake JSONL trace."),
    "demo": ("radixmesh.cluster.cli.demo:demo",
             "Local cluster of 3 agents; shared-prefix chats with caching off and on."),
    "replay": ("radixmesh.cluster.cli.replay:replay_command",
               "Replay TRACE (Mooncake JSONL) through the cluster's router."),
    "front": ("radixmesh.cluster.cli.front:front",
              "Route requests over existing vLLM/SGLang engines by their KV events."),
    "sim": ("radixmesh.cluster.cli.sim:sim", "Replay TRACE over simulated nodes with the production index and policy."),
    "metadata-server": ("radixmesh.cluster.cli.metadata_server:metadata_server",
                        "Run the global metadata service until SIGINT/SIGTERM."),
}
"""Each subcommand, where it lives and its one-line summary: a module is imported only when its
command runs or its own help is asked for, so `radixmesh --help` and `radixmesh stats` answer at once
instead of first loading torch and Ray, which `up` needs (tests/cluster/cli/test_cli_conventions.py checks
the summaries against the commands)."""

CONTEXT = {"auto_envvar_prefix": settings.PREFIX, "help_option_names": ["-h", "--help"]}


def package_version() -> str:
    try:
        return version("radixmesh")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"


def _print_version(ctx: click.Context, _: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(f"radixmesh {package_version()}")
        ctx.exit()


def _load_group_config(ctx: click.Context, _: click.Parameter, path: Path | None) -> None:
    """Make the YAML file at `path` the commands' defaults (click's default_map)."""
    if path is None:
        return
    group = ctx.command
    assert isinstance(group, LazyGroup)
    defaults: dict[str, dict[str, object]] = {}
    for name, options in settings.read_config(path).items():
        command = group.get_command(ctx, str(name))
        if command is None:
            raise click.BadParameter(f"{path}: {name!r} is not a command with options "
                                     f"(commands: {', '.join(group.list_commands(ctx))})")
        defaults[str(name)] = settings.command_defaults(path, str(name), command, options)
    ctx.default_map = defaults


def _load_command_config(ctx: click.Context, _: click.Parameter, path: Path | None) -> None:
    """`radixmesh CMD --config FILE`: FILE is either the group's mapping of command to options (this
    command's part is used) or this command's options alone; its values win over a group --config."""
    if path is None:
        return
    assert ctx.info_name is not None
    loaded = settings.read_config(path)
    options = loaded.get(ctx.info_name, {}) if set(map(str, loaded)) <= set(COMMANDS) else loaded
    mine = settings.command_defaults(path, ctx.info_name, ctx.command, options)
    ctx.default_map = {**(ctx.default_map or {}), **mine}


def _set_log_level(ctx: click.Context, _: click.Parameter, level: str | None) -> None:
    """A command's --log-level: the group's, given after the command name."""
    if level is not None:
        ctx.find_root().params["log_level"] = level
        logging.getLogger().setLevel(level.upper())


CONFIG_HELP = "YAML file of defaults per command, e.g. `up: {model: random-tiny, gpu-blocks: 2048}`."
LOG_LEVEL_HELP = "Logging level of this process and, through Ray, of every actor `up` starts."
LEVELS = click.Choice(LOG_LEVELS, case_sensitive=False)


def _shared_options(command: click.Command) -> None:
    """Give a subcommand the group's --config, --log-level and --version (users type them after the
    command, as `vllm serve --config` takes them)."""
    file = click.Path(exists=True, dir_okay=False, path_type=Path)
    command.params += [
        click.Option(["--config"], type=file, is_eager=True, expose_value=False, callback=_load_command_config,
                     envvar="RADIXMESH_CONFIG", help=CONFIG_HELP),
        click.Option(["--log-level"], type=LEVELS, expose_value=False, callback=_set_log_level,
                     envvar="RADIXMESH_LOG_LEVEL", help=LOG_LEVEL_HELP),
        click.Option(["--version"], is_flag=True, is_eager=True, expose_value=False, callback=_print_version,
                     help="Print radixmesh's version and exit."),
    ]


class LazyGroup(click.Group):
    """A click group whose subcommands are COMMANDS, imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module, name = COMMANDS[cmd_name][0].split(":")
        command: click.Command = getattr(importlib.import_module(module), name)
        if not getattr(command, "_radixmesh_shared", False):  # the module's object, once per process
            settings.name_envvars(cmd_name, command)
            _shared_options(command)
            command._radixmesh_shared = True  # type: ignore[attr-defined]
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The command list from COMMANDS' summaries, importing none of them."""
        with formatter.section("Commands"):
            formatter.write_dl([(name, COMMANDS[name][1]) for name in self.list_commands(ctx)])


@click.group(cls=LazyGroup, context_settings=CONTEXT)
@click.option("--config", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              is_eager=True, expose_value=False, callback=_load_group_config, help=CONFIG_HELP)
@click.option("--log-level", default="INFO", show_default=True, type=LEVELS, help=LOG_LEVEL_HELP)
@click.option("--version", is_flag=True, is_eager=True, expose_value=False, callback=_print_version,
              help="Print radixmesh's version and exit.")
@click.pass_context
def main(ctx: click.Context, log_level: str) -> None:
    """radixmesh: a distributed prefix KV-cache cluster for LLM serving."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    name = ctx.invoked_subcommand
    command = ctx.command.get_command(ctx, name) if name and isinstance(ctx.command, click.Group) else None
    if name and command is not None:
        settings.warn_unknown_variables(name, command, COMMANDS)
