"""`radixmesh sim TRACE --nodes N --capacity BLOCKS [--policy P --eviction E --host-blocks H ...] [--json]`: replay a
trace in the simulator. Every cluster option defaults to what `radixmesh up` runs (SimConfig's
defaults), and the report names the configuration that ran."""

import json

import click

from radixmesh.cluster.policy.base import policy_names
from radixmesh.cluster.sim.config import SimConfig
from radixmesh.cluster.sim.simulator import SimReport, Simulator, prepare
from radixmesh.cluster.sim.trace import read_trace
from radixmesh.common.block_pool.eviction import EVICTION_ORDERS

_UP = SimConfig(nodes=1, capacity_blocks=1)
"""SimConfig's defaults: the options' defaults, so `--help` shows what `up` runs."""


def _on(flag: bool) -> str:
    return "on" if flag else "off"


def format_config(c: SimConfig) -> str:
    """Three lines: the cache settings `up` also has, the routing ones, and the simulator's hardware."""
    cluster_eviction = f"on (window {c.eviction_window})" if c.cluster_eviction else "off"
    candidates = f"holders + {c.candidates} least loaded" if c.candidates else "every node"
    cache = (f"configuration   eviction {c.eviction}, recall {_on(c.cluster_recall)}, handoff {_on(c.handoff)}, "
             f"cluster eviction {cluster_eviction}")
    routing = (f"  routing       candidates {candidates}, {c.routers} router(s), load eps {c.load_eps:g} "
               f"floor {c.load_floor_s:g} s half-life {c.load_half_life_s:g} s, pending {c.pending_ttl_s:g} s after the first token (at most {c.pending_max_s:g} s), "
               f"seed {c.seed}")
    hardware = (f"  hardware      prefill {c.prefill_tokens_per_s:g} tokens/s a node, "
                f"pull {c.pull_bytes_per_s / 1e9:g} GB/s + {c.pull_latency_s * 1e3:g} ms")
    if c.host_blocks or c.disk_blocks:
        hardware += (f", host tier {c.host_blocks} blocks at {c.host_bytes_per_s / 1e9:g} GB/s, "
                     f"disk tier {c.disk_blocks} blocks at {c.disk_bytes_per_s / 1e9:g} GB/s a node")
    return f"{cache}\n{routing}\n{hardware}"


def format_report(r: SimReport) -> str:
    """The human-readable report: configuration, hit rate by source, oracles and achieved / bound,
    load, TTFT."""
    d = r.as_dict()
    hs = r.hits_by_source
    return "\n".join(
        [
            (
                f"policy {r.policy}, {r.nodes} nodes x {r.capacity_blocks} blocks, "
                f"{r.requests} requests, {r.blocks} blocks"
            ),
            format_config(r.config),
            f"hit rate        {r.hit_rate:.3f}  (" + ", ".join(f"{k} {v}" for k, v in hs.items()) + ")",
            "misses by cause " + ", ".join(f"{k} {v}" for k, v in r.misses_by_cause.items()),
            f"infinite bound  {r.infinite_bound:.3f}  achieved/bound {d['achieved_over_bound']:.3f}",
            f"global LRU      {r.global_lru:.3f}  achieved/global LRU {d['achieved_over_global_lru']:.3f}",
            (
                f"max load/mean   {r.max_computed_over_mean:.3f} tokens computed, {r.max_tokens_over_mean:.3f} "
                f"prompt tokens, {r.max_load_over_mean:.3f} requests (routed per node)"
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
@click.option("--policy", type=click.Choice(policy_names()), default=_UP.policy, show_default=True)
@click.option(
    "--eviction", type=click.Choice(sorted(EVICTION_ORDERS)), default=_UP.eviction, show_default=True,
    help="each node's eviction order",
)
@click.option(
    "--recall/--no-recall", default=_UP.cluster_recall, show_default=True,
    help="nodes keep blocks whose last cluster copy was evicted recently as re-used (the cluster's ghost)",
)
@click.option(
    "--handoff/--no-handoff", default=_UP.handoff, show_default=True,
    help="a pull's source evicts first the blocks it sent",
)
@click.option(
    "--cluster-eviction/--no-cluster-eviction", default=_UP.cluster_eviction, show_default=True,
    help="evict replicated chain ends first (simulator only: agents do not)",
)
@click.option(
    "--eviction-window", type=click.IntRange(min=0), default=_UP.eviction_window, show_default=True,
    help="blocks past the next one in eviction order that --cluster-eviction may pick from",
)
@click.option(
    "--candidates", type=click.IntRange(min=0), default=_UP.candidates, show_default=True,
    help="score the prefix holders plus this many least-loaded nodes (0: every node)",
)
@click.option(
    "--host-blocks", type=click.IntRange(min=0), default=_UP.host_blocks, show_default=True,
    help="each node's host tier, in trace blocks: what its gpu evicts, read back (0: none)",
)
@click.option(
    "--disk-blocks", type=click.IntRange(min=0), default=_UP.disk_blocks, show_default=True,
    help="each node's disk tier under the host tier, in trace blocks (0: none)",
)
@click.option(
    "--speedup", type=float, default=1.0, show_default=True, help="divide trace arrival times by this"
)
@click.option("--limit", type=click.IntRange(min=0), default=None, help="replay only the first K requests")
@click.option(
    "--prefill-rate", type=float, default=_UP.prefill_tokens_per_s, show_default=True, help="tokens/s per node"
)
@click.option(
    "--pull-gbps", type=float, default=_UP.pull_bytes_per_s / 1e9, show_default=True, help="pull bandwidth, GB/s"
)
@click.option("--json", "as_json", is_flag=True, help="print one JSON object instead of the table")
def sim(
    trace: str,
    nodes: int,
    capacity: int,
    policy: str,
    eviction: str,
    recall: bool,
    handoff: bool,
    cluster_eviction: bool,
    eviction_window: int,
    candidates: int,
    host_blocks: int,
    disk_blocks: int,
    speedup: float,
    limit: int | None,
    prefill_rate: float,
    pull_gbps: float,
    as_json: bool,
) -> None:
    """Replay TRACE (Mooncake JSONL) over simulated nodes with the production index, cache and policy,
    configured as `radixmesh up` runs unless told otherwise."""
    try:
        config = SimConfig(
            nodes=nodes,
            capacity_blocks=capacity,
            policy=policy,
            prefill_tokens_per_s=prefill_rate,
            pull_bytes_per_s=pull_gbps * 1e9,
            eviction=eviction,
            cluster_recall=recall,
            handoff=handoff,
            cluster_eviction=cluster_eviction,
            eviction_window=eviction_window,
            candidates=candidates,
            host_blocks=host_blocks,
            disk_blocks=disk_blocks,
        )
        requests = prepare(read_trace(trace, speedup=speedup, limit=limit))
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    report = Simulator(config).run(requests)
    click.echo(json.dumps(report.as_dict(), sort_keys=True) if as_json else format_report(report))
