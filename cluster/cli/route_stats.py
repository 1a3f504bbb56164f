"""`radixmesh route / stats`: look at a running deployment through its router's HTTP API.

    radixmesh route "some prompt"          # the decision, why, and the request's stats
    radixmesh stats [--watch]              # global hit rate by source and the per-node table

Neither needs Ray, torch or the router's code: a command that only asks the router answers at once.
"""

import json
import os
import time
import urllib.error
import urllib.request
from typing import Any

import click
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from radixmesh.cluster.api.explain import ROUTE_PATH, format_report
from radixmesh.cluster.launch import cluster_record
from radixmesh.cluster.launch.cluster_record import ca_file_path
from radixmesh.cluster.sim.router_client import ClientAccess

API_KEY_ENV = "RADIXMESH_API_KEY"


def recorded() -> cluster_record.ClusterRecord:
    try:
        record = cluster_record.load()
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    if record is None:
        raise click.ClickException(f"no running deployment recorded at {cluster_record.record_path()} "
                                   "(run `radixmesh up` first)")
    return record


@click.command("route")
@click.argument("prompt")
@click.option("--max-tokens", default=16, show_default=True, type=click.IntRange(min=1))
@click.option("--cache-salt", default="", help="Tenant (salts the prompt's block hashes; empty: shared).")
@click.option("--url", default=None, help="Router URL (default: the recorded deployment's).")
def route(prompt: str, max_tokens: int, cache_salt: str, url: str | None) -> None:
    """Serve PROMPT once and print where it went, why, and where its prompt tokens came from."""
    base = url or recorded().router_url
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "cache_salt": cache_salt}).encode()
    access = client_access()
    req = urllib.request.Request(f"{base}{ROUTE_PATH}", body, {"Content-Type": "application/json", **access.headers()})
    try:
        with urllib.request.urlopen(req, timeout=120, context=access.ssl_context()) as r:
            doc = json.load(r)
    except urllib.error.HTTPError as e:
        error = json.load(e).get("error") or {}  # OpenAI's error object
        raise click.ClickException(error.get("message", str(e))) from None
    except (urllib.error.URLError, OSError) as e:
        raise click.ClickException(f"router at {base} does not answer: {e}") from None
    click.echo(format_report(doc))


@click.command("stats")
@click.option("--url", default=None, help="Router URL (default: the recorded deployment's).")
@click.option("--watch", is_flag=True, help="Refresh until Ctrl-C.")
@click.option("--interval", default=2.0, show_default=True, type=click.FloatRange(min=0.1))
@click.option("--json", "as_json", is_flag=True, help="Print the raw /stats JSON once.")
def stats(url: str | None, watch: bool, interval: float, as_json: bool) -> None:
    """The cluster table: global hit rate by source, TTFT-relevant load, per-node hits."""
    base = url or recorded().router_url
    if as_json:
        click.echo(json.dumps(_fetch(base), indent=1, sort_keys=True))
        return
    console = Console()
    if not watch:
        console.print(render_stats(_fetch(base)))
        return
    with Live(render_stats(_fetch(base)), console=console, refresh_per_second=4) as live:
        try:
            while True:
                time.sleep(interval)  # the refresh period the user asked for
                live.update(render_stats(_fetch(base)))
        except KeyboardInterrupt:
            pass


def client_access() -> ClientAccess:
    """How this machine's commands reach a router: the key RADIXMESH_API_KEY holds (the router's
    --api-key), and trust in the system's roots (and SSL_CERT_FILE) plus the CA certificate `up` wrote
    ($RADIXMESH_HOME/tls/ca.pem) when there is one."""
    ca = ca_file_path()
    return ClientAccess(os.environ.get(API_KEY_ENV, ""), ca if ca.is_file() else None)


def _fetch(base: str) -> dict[str, Any]:
    try:
        access = client_access()
        request = urllib.request.Request(f"{base}/stats", headers=access.headers())
        with urllib.request.urlopen(request, timeout=10, context=access.ssl_context()) as r:
            body: dict[str, Any] = json.load(r)
            return body
    except (urllib.error.URLError, OSError) as e:
        raise click.ClickException(f"router at {base} does not answer: {e}") from None


def render_stats(doc: dict[str, Any]) -> Group:
    """The /stats document as rich tables: cluster totals, hit rate by source, one row per node.

    Fits 80 columns (a terminal's default, and what rich assumes when piped): at most nine narrow
    columns per table, counts past 100,000 shortened (12.3M; `--json` has them exact), headers that
    wrap between words, and cells that fold onto a second line instead of being cut with an
    ellipsis where even that is too wide."""
    r = doc["router"]
    by = r["hit_rate_by_source"]
    total = _table(f"radixmesh: policy {r['active_policy']}" + (" (DEGRADED: metadata unreachable)"
                                                                 if r["degraded"] else ""),
                   "requests", "prompt tokens", "hit rate", "regret tokens", "index precision", "retries")
    total.add_row(count(r["requests"]), count(r["prompt_tokens"]), f"{r['hit_rate']:.1%}", count(r["regret_tokens"]),
                  f"{r['index_precision']:.2f}", count(r["retries"]))
    sources = _table("prompt tokens by source", "local gpu", "local host", "local disk", "remote", "miss")
    sources.add_row(*(f"{by[k]:.1%}" for k in ("local_gpu", "local_host", "local_disk", "remote", "computed")))
    nodes = _table("nodes (tokens: local, remote, miss)", "node", "in flight", "routed", "failed", "requests",
                   "hit rate", "local", "remote", "miss")
    for name, n in sorted(r["nodes"].items()):
        nodes.add_row(name, count(n["inflight"]), count(n["routed"]), count(n["failed_attempts"]),
                      count(n["requests"]), f"{n['hit_rate']:.1%}",
                      count(n["local_gpu"] + n["local_host"] + n["local_disk"]), count(n["remote"]),
                      count(n["computed"]))
    meta = doc.get("metadata")
    footer = Table.grid()
    footer.add_column(overflow="fold")
    footer.add_row("metadata service: " + (f"{meta['live_nodes']} live node(s), {meta['indexed_blocks']} indexed "
                                           f"block(s), state {meta['state_store']}" if meta else "unreachable"))
    return Group(total, sources, nodes, footer)


def _table(title: str, *columns: str) -> Table:
    """A table without lines (each costs a column: 80 hold nine columns only without them) whose
    cells fold; a node's name keeps its line."""
    table = Table(title=title, box=None, pad_edge=False, header_style="bold underline")
    for col in columns:
        table.add_column(col, justify="left" if col == "node" else "right", overflow="fold", no_wrap=col == "node")
    return table


def count(n: int) -> str:
    """`n` in at most six characters: exact below 100,000, else 123.4k / 12.3M / 1.2G."""
    if n < 100_000:
        return str(n)
    for scale, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return str(n)
