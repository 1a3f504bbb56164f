"""`radixmesh replay TRACE [--local N | --url URL] --speedup X --limit K`: a Mooncake trace through
the real cluster's router at trace times; hit rate by source, TTFT percentiles, the oracle gap, and
how many requests admission control refused (HTTP 429; `--retry-refused` sends them again after
the Retry-After the router names)."""

import asyncio
import json

import aiohttp
import click
import ray

from radixmesh.cluster.cli.options import cache_options, chosen_log_level, given
from radixmesh.cluster.cli.route_stats import client_access
from radixmesh.cluster.launch import launcher
from radixmesh.cluster.launch.config import LauncherConfig
from radixmesh.cluster.sim.router_client import RouterUnreachable, served_model
from radixmesh.cluster.sim.trace import read_trace
from radixmesh.cluster.sim.trace_replay import ReplayConfig, ReplayReport, replay
from radixmesh.node_agent import resolve_model


def format_report(r: ReplayReport) -> str:
    hs, d = r.hits_by_source, r.as_dict()
    return "\n".join([
        f"{r.requests} requests, {r.prompt_tokens} prompt tokens in {r.wall_s:.1f} s",
        (f"hit rate        {r.hit_rate:.3f}  (local gpu {hs['local_gpu']}, local host {hs['local_host']}, "
        f"local disk {hs['local_disk']}, remote {hs['remote']}, miss {hs['computed']} tokens)"),
        (f"block hit rate  {r.block_hit_rate:.3f}  infinite-cache bound {r.infinite_bound:.3f}  "
        f"achieved/bound {d['achieved_over_bound']:.3f}"),
        f"TTFT p50 {r.ttft_p50_s * 1e3:.1f} ms  p99 {r.ttft_p99_s * 1e3:.1f} ms  (of {r.requests - r.refused} served)",
        f"refused (HTTP 429) {r.refused} of {r.requests} requests" + (f", after {r.retried} retries" if r.retried else ""),
    ])


@click.command("replay")
@click.argument("trace", type=click.Path(exists=True, dir_okay=False))
@click.option("--local", "local_nodes", type=click.IntRange(1, 64), default=None,
              help="Start a local cluster of N agents for the replay (else use --url).")
@click.option("--url", default=None, help="Router of a running deployment.")
@click.option("--speedup", type=float, default=1.0, show_default=True, help="Divide trace times by this.")
@click.option("--limit", type=click.IntRange(min=0), default=100, show_default=True, help="First K requests.")
@click.option("--sequential", is_flag=True, help="One request after another, ignoring trace times.")
@click.option("--max-prompt-blocks", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--block-size", type=click.IntRange(min=1), default=16, show_default=True,
              help="The deployment's tokens per block (one trace block = one cluster block).")
@click.option("--model", "model_spec", default="random-tiny", show_default=True,
              help="With --local: the agents' model, as `up --model` names it.")
@click.option("--served-model-name", default="",
              help="Model id the requests name [default: with --url, the router's own (its /v1/models); with "
                   "--local, the model's name].")
@click.option("--retry-refused", is_flag=True,
              help="Send a request the router refuses (HTTP 429) again after its Retry-After (else count it).")
@click.option("--max-retries", type=click.IntRange(min=0), default=ReplayConfig().max_retries, show_default=True,
              help="With --retry-refused: sends after the first at most, then the request counts as refused.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@cache_options
def replay_command(trace: str, local_nodes: int | None, url: str | None, speedup: float, limit: int,
                   sequential: bool, max_prompt_blocks: int, block_size: int, model_spec: str, served_model_name: str,
                   retry_refused: bool, max_retries: int, as_json: bool, eviction: str, handoff: bool) -> None:
    """Replay TRACE (Mooncake JSONL) through the cluster's router."""
    if (local_nodes is None) == (url is None):
        raise click.UsageError("give exactly one of --local N and --url URL")
    if url is not None and given("eviction", "handoff"):
        raise click.UsageError("--eviction and --handoff set up the agents of --local; a running "
                               "deployment keeps the ones it was started with")
    try:
        requests = read_trace(trace, speedup=speedup, limit=limit)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    if url is not None and given("model_spec"):
        raise click.UsageError("--model names the agents' model of --local; against --url, the router says which "
                               "model it serves (or give --served-model-name)")
    if url is not None:
        try:
            served_model_name = served_model_name or asyncio.run(served_model(url, client_access()))
        except RouterUnreachable as e:
            raise click.ClickException(str(e)) from None
    else:
        try:
            model = resolve_model(model_spec)
        except ValueError as e:
            raise click.UsageError(str(e)) from None
        served_model_name = served_model_name or model.name
    config = ReplayConfig(block_size=block_size, sequential=sequential, max_prompt_blocks=max_prompt_blocks,
                          model=served_model_name, retry_refused=retry_refused, max_retries=max_retries)
    if url is not None:
        try:
            report = asyncio.run(replay(url, requests, config, access=client_access()))
        except (aiohttp.ClientError, OSError) as e:
            raise click.ClickException(f"router at {url} does not answer: {e}") from None
    else:
        cluster = LauncherConfig(local_nodes=local_nodes, block_size=block_size, model=model,
                                 model_name=served_model_name,
                                 log_level=chosen_log_level(), eviction=eviction, handoff=handoff)
        launcher.init_local_ray(cluster)
        try:
            deployment = asyncio.run(launcher.up(cluster))
            report = asyncio.run(replay(deployment.router_url, requests, config))
        finally:
            asyncio.run(launcher.down())
            ray.shutdown()
    click.echo(json.dumps(report.as_dict(), sort_keys=True) if as_json else format_report(report))
