"""What TLS costs (issue 38, item 16), plain text measured in the same run as the baseline, on 127.0.0.1.

Four pairs, each TLS (a leaf of the cluster CA, as `up` and the agents mint) against plain text:
  metadata_rpc      a GetStats round trip on an open gRPC channel (what agents and the router keep)
  metadata_connect  a new channel: connect (TCP, and TLS's handshake), then one GetStats
  metrics_scrape    an agent's /metrics GET with its bearer token on a kept-alive connection (Prometheus)
  metrics_connect   the same GET on a new connection each time
and `mint_leaf_ms`, what an agent pays once at start to derive the CA and mint its /metrics certificate.
KV pulls do not change: the transfer plane is not wrapped in TLS (docs/security.md#tls).

Usage: python bench/tls_cost.py [--calls N] [--out DIR] [--smoke]
Prints the figures, then one JSON object as the last line (also DIR/tls_cost.json, default bench/results).
"""

import argparse
import asyncio
import functools
import json
import platform
import ssl
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp

from radixmesh.cluster.metadata.server import ServerOptions, TlsFiles, create_server
from radixmesh.cluster.metadata.service import MetadataService
from radixmesh.common.cluster_ca import ClusterCa
from radixmesh.common.metadata.auth import CallerCredentials
from radixmesh.common.metadata.client import MetadataClient
from radixmesh.common.metrics.scrape import MetricsServer, metrics_token
from radixmesh.common.secret import ClusterSecret

HOST = "127.0.0.1"
CALLS, SMOKE_CALLS = 400, 20
SECRET = ClusterSecret(bytes(range(32)))
# A render about the size of one agent's exposition (a few hundred samples), cached by the server.
EXPOSITION = "".join(f'radixmesh_bench_x{{i="{i}"}} {i}.0\n' for i in range(300))


async def timed(call: Callable[[], Awaitable[object]], calls: int) -> dict[str, float]:
    """Median and p90 of `calls` sequential calls, in microseconds (after 5 unmeasured ones)."""
    for _ in range(5):
        await call()
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        await call()
        times.append((time.perf_counter() - t0) * 1e6)
    return summary(times)


def summary(times: list[float]) -> dict[str, float]:
    """Median and p90 of timings in microseconds, rounded to 0.1 us (bench/ray_tls_cost.py's too)."""
    times = sorted(times)
    return {"p50_us": round(statistics.median(times), 1), "p90_us": round(times[int(0.9 * (len(times) - 1))], 1)}


async def metadata_pair(calls: int) -> dict[str, dict[str, dict[str, float]]]:
    served = ClusterCa.derive(SECRET).issue([HOST])
    out: dict[str, dict[str, dict[str, float]]] = {"metadata_rpc": {}, "metadata_connect": {}}
    cluster = CallerCredentials.cluster(SECRET)
    for arm, tls in (("plain", None), ("tls", TlsFiles(served.cert_chain, served.private_key, served.ca))):
        server, port = create_server(MetadataService(), ServerOptions(HOST, 0, secret=SECRET, tls=tls,
                                                                      upkeep_interval_s=None))
        await server.start()
        roots = None if tls is None else tls.trust
        try:
            async with MetadataClient(f"{HOST}:{port}", credentials=cluster, root_certificates=roots) as client:
                out["metadata_rpc"][arm] = await timed(client.stats, calls)
            connect = functools.partial(connect_and_call, f"{HOST}:{port}", cluster, roots)
            out["metadata_connect"][arm] = await timed(connect, max(calls // 4, 5))
        finally:
            await server.stop(None)
    return out


async def connect_and_call(target: str, credentials: CallerCredentials, roots: bytes | None) -> None:
    async with MetadataClient(target, credentials=credentials, root_certificates=roots) as fresh:
        await fresh.stats()


async def scrape(http: aiohttp.ClientSession, url: str, headers: dict[str, str], context: ssl.SSLContext | bool) -> None:
    async with http.get(url, headers=headers, ssl=context) as r:
        assert r.status == 200
        await r.read()


async def metrics_pair(calls: int) -> dict[str, dict[str, dict[str, float]]]:
    async def render() -> str:
        return EXPOSITION

    token = metrics_token(SECRET)
    headers = {"Authorization": f"Bearer {token}"}
    client_tls = ssl.create_default_context(cadata=ClusterCa.derive(SECRET).certificate.decode())
    out: dict[str, dict[str, dict[str, float]]] = {"metrics_scrape": {}, "metrics_connect": {}}
    for arm, served in (("plain", None), ("tls", ClusterCa.derive(SECRET).issue([HOST]))):
        server = MetricsServer(render, HOST, 0, token, tls=served)
        address = await server.start()
        url = f"{server.scheme}://{address}/metrics"
        context: ssl.SSLContext | bool = client_tls if served is not None else True
        try:
            for name, force_close in (("metrics_scrape", False), ("metrics_connect", True)):
                async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=force_close)) as http:
                    get = functools.partial(scrape, http, url, headers, context)
                    out[name][arm] = await timed(get, calls if not force_close else max(calls // 4, 5))
        finally:
            await server.stop()
    return out


def mint_leaf_ms(rounds: int) -> float:
    t0 = time.perf_counter()
    for _ in range(rounds):
        ClusterCa.derive(SECRET).issue(["198.18.0.2"])
    return round((time.perf_counter() - t0) * 1e3 / rounds, 2)


async def main(calls: int) -> dict[str, object]:
    pairs = {**await metadata_pair(calls), **await metrics_pair(calls)}
    result: dict[str, object] = {"calls": calls, "host": HOST, "python": platform.python_version(),
                                 "openssl": ssl.OPENSSL_VERSION}
    for name, arms in pairs.items():
        result[name] = {**arms, "ratio_p50_tls_vs_plain": round(arms["tls"]["p50_us"] / arms["plain"]["p50_us"], 2)}
    result["mint_leaf_ms"] = mint_leaf_ms(3 if calls < CALLS else 20)
    return result


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=CALLS, help="timed calls per arm (a quarter of them for new connections)")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results", help="folder for tls_cost.json")
    ap.add_argument("--smoke", action="store_true", help=f"tiny run: {SMOKE_CALLS} calls per arm")
    args = ap.parse_args()
    result = asyncio.run(main(SMOKE_CALLS if args.smoke else args.calls))
    for key, value in result.items():
        if isinstance(value, dict):
            plain, tls = value["plain"], value["tls"]
            print(f"{key:18s} plain p50 {plain['p50_us']:9.1f} us  tls p50 {tls['p50_us']:9.1f} us  "
                  f"ratio {value['ratio_p50_tls_vs_plain']:.2f}")
        else:
            print(f"{key:18s} {value}")
    if args.smoke:
        result["smoke"] = True
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "tls_cost.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))
