"""`radixmesh bench-trace WORKLOAD -o FILE`: a seeded bench workload written as a Mooncake trace for
`radixmesh sim` (the bench's own sessions and Poisson arrivals; see radixmesh.cluster.bench.sim_trace).

    radixmesh bench-trace docs --requests 1500 --rate 4 --scale 8 -o docs.jsonl
    radixmesh bench-trace chat --scale 4 --set max_prompt_tokens=32768 --set systems=0 --set turns=3,20 -o chat.jsonl

tests/data/traces/README.md has the commands of the committed traces and why their settings.
"""

import dataclasses
from pathlib import Path

import click

from radixmesh.cluster.bench.sim_trace import trace_text
from radixmesh.cluster.bench.workloads import GENERATORS
from radixmesh.cluster.sim.trace import TRACE_BLOCK_TOKENS

_SETTABLE = (int, float, tuple)
"""Kinds of generator field --set may give: numbers and (low, high) ranges."""


def _setting(default: object, text: str) -> object:
    """`text` read as a value of the same shape as the field's `default`: a number or a range `a,b`."""
    if isinstance(default, tuple):
        parts = text.split(",")
        if len(parts) != len(default):
            raise ValueError(f"{text!r} is not {len(default)} comma-separated numbers")
        return tuple(_setting(d, p) for d, p in zip(default, parts, strict=True))
    return float(text) if isinstance(default, float) else int(text)


def _workload_fields(name: str, settings: tuple[str, ...], scale: float) -> dict[str, object]:
    """The generator's fields from `--set FIELD=VALUE`; click.UsageError naming the valid fields."""
    defaults = {f.name: f.default for f in dataclasses.fields(GENERATORS[name])
                if isinstance(f.default, _SETTABLE) and f.name != "scale"}
    out: dict[str, object] = {"scale": scale}
    for item in settings:
        key, eq, value = item.partition("=")
        if not eq or key not in defaults:
            raise click.UsageError(f"--set {item!r}: give FIELD=VALUE with FIELD one of {', '.join(defaults)}")
        try:
            out[key] = _setting(defaults[key], value)
        except ValueError:
            raise click.UsageError(f"--set {item!r}: {key} takes a value like {defaults[key]!r}") from None
    return out


@click.command("bench-trace")
@click.argument("workload", type=click.Choice(list(GENERATORS)))
@click.option("--requests", type=click.IntRange(min=1), default=1000, show_default=True,
              help="Requests in the trace (the first N the bench would send).")
@click.option("--rate", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True,
              help="Offered request rate, per second (Poisson arrivals).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--scale", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True,
              help="Multiply the generator's token lengths (system prompts, documents, turns).")
@click.option("--set", "settings", multiple=True, metavar="FIELD=VALUE",
              help="A generator field, e.g. `turns=4,16` or `think_median_s=90` (repeatable).")
@click.option("--block-tokens", type=click.IntRange(min=1), default=TRACE_BLOCK_TOKENS, show_default=True,
              help="Tokens per hash id (`radixmesh sim` reads 512-token blocks only).")
@click.option("-o", "--out", "out", type=click.Path(dir_okay=False, writable=True, path_type=Path), required=True,
              help="The JSONL file to write.")
def bench_trace(workload: str, requests: int, rate: float, seed: int, scale: float, settings: tuple[str, ...],
                block_tokens: int, out: Path) -> None:
    """Write a seeded bench workload as a Mooncake JSONL trace."""
    try:
        load = GENERATORS[workload](**_workload_fields(workload, settings, scale))  # type: ignore[arg-type]
        text = trace_text(load, rate, requests, seed, block_tokens)
    except ValueError as e:  # e.g. a range high before low, a system prompt past the context
        raise click.UsageError(f"cannot generate {workload} with these settings: {e}") from None
    # Generated whole before the file is opened: bad settings leave no half-written trace.
    out.write_text(text, encoding="utf-8")
    click.echo(f"wrote {text.count(chr(10))} requests to {out}", err=True)
