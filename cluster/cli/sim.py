"""`radixmesh sim TRACE --nodes N --capacity BLOCKS --policy P [--json]`: replay a trace in the simulator."""

import json

import click

from radixmesh.cluster.policy.base import policy_names
from radixmesh.cluster.sim.simulator import SimConfig, SimReport, Simulator, prepare
from radixmesh.cluster.sim.trace import read_trace


def format_report(r: SimReport) -> str:
    """The human-readable report: hit rate by source, oracles and achieved / bound, load, TTFT."""
    d = r.as_dict()
    hs = r.hits_by_source
    return "\n".join(
        [
            (
                f"policy {r.policy}, {r.nodes} nodes x {r.capacity_blocks} blocks, "
                f"{r.requests} requests, {r.blocks} blocks"
            ),
            f"hit rate        {r.hit_rate:.3f}  (local {hs['local']}, remote {hs['remote']}, miss {hs['miss']})",
            "misses by cause " + ", ".join(f"{k} {v}" for k, v in r.misses_by_cause.items()),
            f"infinite bound  {r.infinite_bound:.3f}  achieved/bound {d['achieved_over_bound']:.3f}",
            f"global LRU      {r.global_lru:.3f}  achieved/global LRU {d['achieved_over_global_lru']:.3f}",
            (
                f"max load/mean   {r.max_tokens_over_mean:.3f} prompt tokens, "
                f"{r.max_load_over_mean:.3f} requests (routed per node)"
            ),
            (
                f"TTFT p50 {r.ttft_p50_s * 1e3:.1f} ms  p99 {r.ttft_p99_s * 1e3:.1f} ms  "
                f"routing {r.route_us_mean:.0f} us/request"
            ),
        ]
    )


@click.command("sim")
@click.argument("trace", type=click.Path(exists=True, dir_okay=False))
@click.option("--nodes", type=click.IntRange(min=1), default=8, show_default=True, help="virtual nodes")
@click.option(
    "--capacity",
    type=click.IntRange(min=1),
    default=500,
    show_default=True,
    help="cache capacity per node, in trace blocks (512 tokens)",
)
@click.option("--policy", type=click.Choice(policy_names()), default="cost", show_default=True)
@click.option(
    "--speedup", type=float, default=1.0, show_default=True, help="divide trace arrival times by this"
)
@click.option("--limit", type=click.IntRange(min=0), default=None, help="replay only the first K requests")
@click.option("--prefill-rate", type=float, default=20_000.0, show_default=True, help="tokens/s per node")
@click.option("--pull-gbps", type=float, default=10.0, show_default=True, help="pull bandwidth, GB/s")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object instead of the table")
def sim(
    trace: str,
    nodes: int,
    capacity: int,
    policy: str,
    speedup: float,
    limit: int | None,
    prefill_rate: float,
    pull_gbps: float,
    as_json: bool,
) -> None:
    """Replay TRACE (Mooncake JSONL) over simulated nodes with the production index, cache and policy."""
    try:
        config = SimConfig(
            nodes=nodes,
            capacity_blocks=capacity,
            policy=policy,
            prefill_tokens_per_s=prefill_rate,
            pull_bytes_per_s=pull_gbps * 1e9,
        )
        requests = prepare(read_trace(trace, speedup=speedup, limit=limit))
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    report = Simulator(config).run(requests)
    click.echo(json.dumps(report.as_dict(), sort_keys=True) if as_json else format_report(report))
