"""`radixmesh demo`: start a local 3-agent cluster, run the shared-prefix chat workload with caching
defeated and as deployed (`--order` picks which half runs first), print both side by side and one
real answer, stop the cluster."""

import asyncio
import logging
import time
from functools import partial

import click
import ray
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from radixmesh.cluster.cli.options import (
    cache_options,
    chosen_engine,
    chosen_gpu_blocks,
    chosen_log_level,
    engine_options,
)
from radixmesh.cluster.launch import launcher
from radixmesh.cluster.launch.config import LauncherConfig
from radixmesh.cluster.sim.demo_workload import DemoRun, DemoWorkload, ask, run_workload
from radixmesh.node_agent import SMOLLM2

QUESTION = "What is the capital of France?"
ORDERS = ("off-first", "on-first")


def comparison_table(on: DemoRun, off: DemoRun, engine: str = "real") -> Table:
    """Caching on vs off: hit rate, hits by source, TTFT p50/p99, bytes pulled."""
    table = Table(title=f"radixmesh demo: shared-prefix chats through the router ({engine} engine)")
    table.add_column("")
    table.add_column("caching on", justify="right")
    table.add_column("caching off", justify="right")

    def share(run: DemoRun, source: str) -> str:
        return f"{run.hits_by_source[source] / run.prompt_tokens:.1%}" if run.prompt_tokens else "-"

    table.add_row("requests", str(on.requests), str(off.requests))
    table.add_row("prompt tokens", str(on.prompt_tokens), str(off.prompt_tokens))
    table.add_row("global hit rate", f"{on.hit_rate:.1%}", f"{off.hit_rate:.1%}")
    for source, name in (("local_gpu", "  local gpu"), ("local_host", "  local host"),
                         ("local_disk", "  local disk"), ("remote", "  remote (pulled)"),
                         ("computed", "  miss (prefilled)")):
        table.add_row(name, share(on, source), share(off, source))
    for q in (50, 99):
        table.add_row(f"TTFT p{q}", f"{on.ttft(q) * 1e3:.1f} ms", f"{off.ttft(q) * 1e3:.1f} ms")
    table.add_row("bytes pulled", f"{on.bytes_pulled:,}", f"{off.bytes_pulled:,}")
    table.add_row("wall time", f"{on.wall_s:.1f} s", f"{off.wall_s:.1f} s")
    return table


@click.command("demo")
@click.option("--chats", default=DemoWorkload().chats, show_default=True, type=click.IntRange(min=1))
@click.option("--turns", default=DemoWorkload().turns, show_default=True, type=click.IntRange(min=1))
@click.option("--model", "model_spec", default=SMOLLM2, show_default=True,
              help=f"{SMOLLM2} (the real model), random-tiny (seeded random weights: fast, its text is noise), a local "
                   "Hugging Face directory or a .gguf file.")
@click.option("--order", type=click.Choice(ORDERS), default="off-first", show_default=True,
              help="Which half runs first. The uncached half salts every request, so neither half can "
                   "reuse what the other left; running both orders shows the comparison is not an artefact "
                   "of warm-up.")
@cache_options
@engine_options
def demo(chats: int, turns: int, model_spec: str, order: str, eviction: str, handoff: bool, engine: str,
         speedup: float) -> None:
    """Local cluster of 3 agents; shared-prefix chats with caching off and on; the comparison table."""
    console = Console()
    # The openai client logs every request at INFO; the progress bar says it better.
    for noisy in ("httpx", "httpx2"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    t0 = time.monotonic()
    modeled, model = chosen_engine(engine, speedup, model_spec)
    try:
        config = LauncherConfig(local_nodes=3, model=model, modeled=modeled, log_level=chosen_log_level(),
                                gpu_blocks=chosen_gpu_blocks(None, modeled, 16), eviction=eviction, handoff=handoff)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    workload = DemoWorkload(chats=chats, turns=turns)
    with console.status("starting Ray, metadata service, 3 agents and the router ..."):
        launcher.init_local_ray(config)
        try:
            deployment = asyncio.run(launcher.up(config))
        except BaseException:
            ray.shutdown()
            raise
    console.print(f"cluster up in {time.monotonic() - t0:.1f} s ({config.engine_label} engine): router "
                  f"{deployment.router_url}")
    try:
        with Progress(console=console) as progress:
            runs: dict[bool, DemoRun] = {}
            halves = (False, True) if order == "off-first" else (True, False)
            for caching in halves:
                label = "caching on" if caching else "caching off"
                task = progress.add_task(label, total=workload.requests)
                runs[caching] = asyncio.run(run_workload(deployment.router_url, config.served_model_name, workload,
                                                         label, caching=caching,
                                                         on_done=partial(progress.advance, task)))
        answer = asyncio.run(ask(deployment.router_url, config.served_model_name, QUESTION))
    finally:
        asyncio.run(launcher.down())
        ray.shutdown()
    on, off = runs[True], runs[False]
    console.print(comparison_table(on, off, config.engine_label))
    console.print(f"{config.served_model_name}, asked {QUESTION!r}: {answer.strip()!r}")
    ratio = off.ttft(50) / on.ttft(50) if on.ttft(50) else float("inf")
    console.print(f"TTFT p50 with caching off / on: {ratio:.2f}x; demo took {time.monotonic() - t0:.1f} s")
