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
    req = urllib.request.Request(f"{base}{ROUTE_PATH}", body, {"Content-Type": "application/json", **_auth()})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
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


def _auth() -> dict[str, str]:
    """The API key header, when RADIXMESH_API_KEY holds the key of the router's --api-key."""
    key = os.environ.get(API_KEY_ENV, "")
    return {"Authorization": f"Bearer {key}"} if key else {}


def _fetch(base: str) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(urllib.request.Request(f"{base}/stats", headers=_auth()), timeout=10) as r:
            body: dict[str, Any] = json.load(r)
            return body
    except (urllib.error.URLError, OSError) as e:
        raise click.ClickException(f"router at {base} does not answer: {e}") from None


def render_stats(doc: dict[str, Any]) -> Group:
    """The /stats document as two rich tables: cluster totals, then one row per node."""
    r = doc["router"]
    by = r["hit_rate_by_source"]
    total = Table(title=f"radixmesh: policy {r['active_policy']}" + (" (DEGRADED: metadata unreachable)"
                                                                      if r["degraded"] else ""))
    for col in ("requests", "prompt tokens", "hit rate", "local gpu", "local host", "local disk", "remote", "miss",
                "regret tokens", "index precision", "retries"):
        total.add_column(col, justify="right")
    total.add_row(str(r["requests"]), str(r["prompt_tokens"]), f"{r['hit_rate']:.1%}", f"{by['local_gpu']:.1%}",
                  f"{by['local_host']:.1%}", f"{by['local_disk']:.1%}", f"{by['remote']:.1%}",
                  f"{by['computed']:.1%}", str(r["regret_tokens"]),
                  f"{r['index_precision']:.2f}", str(r["retries"]))
    nodes = Table(title="nodes")
    for col in ("node", "in flight", "routed", "failed", "requests", "hit rate", "local", "remote", "miss"):
        nodes.add_column(col, justify="right")
    for name, n in sorted(r["nodes"].items()):
        nodes.add_row(name, str(n["inflight"]), str(n["routed"]), str(n["failed_attempts"]), str(n["requests"]),
                      f"{n['hit_rate']:.1%}", str(n["local_gpu"] + n["local_host"] + n["local_disk"]),
                      str(n["remote"]), str(n["computed"]))
    meta = doc.get("metadata")
    footer = Table.grid()
    footer.add_row("metadata service: " + (f"{meta['live_nodes']} live node(s), {meta['indexed_blocks']} indexed "
                                           f"block(s), state {meta['state_store']}" if meta else "unreachable"))
    return Group(total, nodes, footer)
