"""`ray up deploy/local-cluster.yaml` on 3 namespace hosts, then what a real cluster must survive.

The tests share one cluster (module fixture) and run in this file's order, each leaving it serving:
workload and pulls across hosts, the listening sockets of every host, a host joining, a host
partitioned and healed, a host killed. Every wait polls observable state with a deadline.
"""

import asyncio
import concurrent.futures
import http.client
import itertools
import json
import socket
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from radixmesh.cluster.api.explain import ROUTE_PATH
from radixmesh.common.cluster_ca import ClusterCa
from radixmesh.common.metadata.auth import CallerCredentials
from radixmesh.common.metadata.client import MetadataClient
from radixmesh.common.secret import ClusterSecret
from tests.support.netns_hosts import Host, listening_sockets
from tests.support.poll import wait_for
from tests.support.ray_up_cluster import RayUpCluster

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(900)]

MODEL = "random-tiny"  # the YAML's `radixmesh up` serves the default, seeded random `tiny` shape
PREFIX = "".join(f"Rule {i}: be precise about topic {i % 7}. " for i in range(100))
"""~3.5 kB (tokens, with the byte tokenizer) shared by the workload's prompts: 220 blocks."""


def agent_of(host: Host) -> str:
    return f"{host.address}-cpu"


def router_nodes(c: RayUpCluster) -> dict[str, dict[str, int]]:
    nodes: dict[str, dict[str, int]] = c.get("/stats")["router"]["nodes"]
    return nodes


def complete(c: RayUpCluster, prompt: str, salt: str = "", max_tokens: int = 8) -> Any:
    """The router's OpenAI completion (JSON) for `prompt`, greedy; `salt`: its cache_salt (tenant)."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    return c.post("/v1/completions", {**body, "cache_salt": salt} if salt else body)


def text(answer: Any) -> str:
    [choice] = answer["choices"]
    return str(choice["text"])


def cached_tokens(answer: Any) -> int:
    return int(answer["usage"]["prompt_tokens_details"]["cached_tokens"])


def samples(c: RayUpCluster, name: str) -> list[tuple[dict[str, str], float]]:
    return [(s.labels, s.value) for f in text_string_to_metric_families(c.metrics()) for s in f.samples
            if s.name == name]


@contextmanager
def steady_traffic(c: RayUpCluster, label: str) -> Iterator[list[str]]:
    """Requests one after another (a few shared prefixes) until the block ends; yields the list of
    failures, which the caller asserts empty. The client waits up to 120 s per request: a request
    caught by a partition completes once the router retries it or the link heals."""
    failures: list[str] = []
    stop = threading.Event()

    def run() -> None:
        i = 0
        while not stop.is_set():
            try:
                complete(c, f"{PREFIX[: 600 + 200 * (i % 3)]} {label} request {i}?", max_tokens=4)
            except (OSError, urllib.error.HTTPError) as e:
                failures.append(f"request {i}: {e!r}")
            i += 1

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield failures
    finally:
        stop.set()
        thread.join(timeout=150)


def test_ray_up_brings_one_agent_per_worker_host(ray_up_cluster: RayUpCluster) -> None:
    c = ray_up_cluster
    want = sorted(agent_of(h) for h in c.hosts[1:])
    wait_for("an agent on every worker host", lambda: sorted(router_nodes(c)) == want or None, 240, c.logs)
    assert c.get("/stats")["metadata"]["state_store"].startswith("redis://127.0.0.1:6380")


def test_shared_prefixes_are_pulled_across_hosts_over_ucx_with_cacheless_outputs(ray_up_cluster: RayUpCluster,
                                                                                  ) -> None:
    """Bursts of requests on one prefix held by one host: bounded load sends some to the other host,
    which pulls the prefix over UCX instead of recomputing it (bursts until one pull is seen: when
    the load bound lets a node take a whole burst depends on its measured prefill rate)."""
    c = ray_up_cluster
    reasons: list[str] = []
    for burst in range(4):
        prompts = [f"{PREFIX} Burst {burst}, question {q}: why?" for q in range(12)]
        # A unique cache_salt per request: nothing is shared or reused, every token is computed.
        cacheless = [text(complete(c, p, salt=f"cacheless-{burst}-{i}")) for i, p in enumerate(prompts)]
        # Those salted prompts may have evicted the shared prefix's tail: one request puts it back
        # whole on one host, so the burst finds a long prefix to pull rather than one to recompute.
        complete(c, f"{PREFIX} Warm-up {burst}: why?")
        # `radixmesh route`'s endpoint: each answer carries the router's reason and the served stats.
        with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
            reports = list(pool.map(lambda p: c.post(ROUTE_PATH, {"prompt": p, "max_tokens": 8}), prompts))
        assert [r["text"] for r in reports] == cacheless
        assert sum(sum(r["stats"]["tokens"].values()) - r["stats"]["tokens"]["computed"] for r in reports) > 0
        reasons += [f"burst {burst} -> {r['node']}: {r['reason']}" for r in reports]
        if c.get("/stats")["router"]["remote"] > 0:
            break
    else:
        pulls = [(s, v) for s, v in samples(c, "radixmesh_pulls_total") if v > 0]
        pytest.fail(f"no request pulled its prefix in 4 bursts of 12; router's view: {router_nodes(c)}; "
                    f"pulls by outcome: {pulls}; the router's reasons:\n" + "\n".join(reasons))
    # The agents count what they pulled from each peer; peers are other hosts.
    pulled = {(s["node"], s["peer"]): v for s, v in samples(c, "radixmesh_pull_bytes_total") if v > 0}
    assert pulled, "no KV bytes pulled between agents"
    for node, peer in pulled:
        assert node != peer and node.startswith("198.18.0.") and peer.startswith("198.18.0."), (node, peer)
    ok = {(s["node"], s["peer"]) for s, v in samples(c, "radixmesh_pulls_total") if s["outcome"] == "ok" and v > 0}
    assert set(pulled) <= ok
    print(f"\nKV bytes pulled (node <- peer) after {burst + 1} burst(s): {pulled}")


PARTS = (
    # (process name or a piece of its command line, what it is); the first match names a socket.
    ("ray::RouterActo", "radixmesh router: HTTP on the head's address"),
    ("ray::MetadataAc", "radixmesh metadata service: gRPC on the head's address"),
    ("ray::AgentActor", "radixmesh agent: KV transfer server, UCX and /metrics on its host's address"),
    ("redis-server", "Redis, the metadata service's state: loopback of the head"),
    ("radixmesh up ", "`radixmesh up` while it starts the deployment (a Ray driver: Ray's core-worker gRPC server)"),
    ("sshd", "the host's sshd (ray up and the autoscaler log in through it)"),
    ("gcs_server", "Ray's GCS"),
    ("raylet", "Ray's raylet and object manager"),
    ("ray::DashboardA", "Ray's dashboard agent (HTTP, gRPC, metrics export)"),
    ("ray::RuntimeEnv", "Ray's runtime-env agent"),
    ("ray/dashboard/", "Ray's dashboard (head)"),
    ("ray/autoscaler/", "Ray's autoscaler monitor (head)"),
    ("ray.util.client.server", "Ray's client server (head)"),
    ("ray::", "a Ray worker process"),
)
RADIXMESH = ("ray::RouterActo", "ray::MetadataAc", "ray::AgentActor", "redis-server")
WILDCARD = {"*", "0.0.0.0", "[::]"}


def process_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return "?"


def test_every_host_listens_only_where_it_should(ray_up_cluster: RayUpCluster) -> None:
    """What listens on every host, on which address, and why. Everything radixmesh opens binds the
    host's own address, or loopback; only Ray binds every interface (its gRPC servers, one of them
    in every Ray worker process, our actors' included)."""
    c = ray_up_cluster
    metadata_address = json.loads((c.home / ".radixmesh" / "cluster.json").read_text())["metadata_address"]
    table = []
    for host in c.hosts:
        own = {host.address, f"[::ffff:{host.address}]", "127.0.0.1", "[::ffff:127.0.0.1]"}
        wildcards: dict[int, int] = {}
        for proto, local, name, pid in listening_sockets(c.network, host):
            address = local.rsplit(":", 1)[0]
            cmd = process_line(pid)
            [why, *_] = [why for key, why in PARTS if key in name or key in cmd] or [f"unknown: {cmd[:80]}"]
            assert not why.startswith("unknown"), f"{host.netns}: {local} {name}: {why}"
            assert address in own | WILDCARD, f"{host.netns}: {local} ({name}) is not this host's address"
            if address in WILDCARD:
                assert name.startswith("ray::") or "ray" in cmd or "radixmesh up " in cmd, \
                    f"{host.netns}: {name} listens on {local}"
                wildcards[pid] = wildcards.get(pid, 0) + 1
                if name.startswith(RADIXMESH):
                    why = "Ray's core-worker gRPC server inside our actor's process"
            table.append((host.address, proto, local, name, why))
        for pid, n in wildcards.items():
            # Our actors' processes open one wildcard socket, Ray's core worker; none of ours.
            if process_line(pid).startswith(RADIXMESH):
                assert n == 1, (host.netns, pid, process_line(pid))
    print("\n" + "\n".join(f"{h:<11} {p:<4} {local:<26} {name:<16} {why}" for h, p, local, name, why in table))
    head = c.head.address
    on_head = {(local, name) for h, _, local, name, _ in table if h == head}
    assert (f"{head}:8000", "ray::RouterActo") in on_head
    host, port = metadata_address.rsplit(":", 1)
    assert host == head and {(f"{head}:{port}", "ray::MetadataAc"), (f"[::ffff:{head}]:{port}", "ray::MetadataAc")} & on_head
    assert ("127.0.0.1:6380", "redis-server") in on_head
    for worker in c.hosts[1:]:
        # The transfer server and UCX's own listener, on the host's address only.
        mine = [row for row in table if row[0] == worker.address and row[3] == "ray::AgentActor"
                and row[2].startswith(f"{worker.address}:")]
        assert len(mine) >= 2, mine


def test_the_head_serves_tls_by_default_and_refuses_plain_text(ray_up_cluster: RayUpCluster) -> None:
    """Router and metadata service bind the head's address: TLS with a certificate of the cluster CA,
    without any TLS flag in the YAML's `up`; plain text gets no answer."""
    c = ray_up_cluster
    assert c.router_url.startswith("https://") and c.get("/healthz")
    with pytest.raises((OSError, http.client.HTTPException)):
        urllib.request.urlopen(f"http://{c.head.address}:8000/healthz", timeout=5).read()
    target = json.loads((c.home / ".radixmesh" / "cluster.json").read_text())["metadata_address"]
    credentials = CallerCredentials.cluster(ClusterSecret.from_hex((c.home / ".radixmesh" / "secret").read_text()))
    ca = (c.home / ".radixmesh" / "tls" / "ca.pem").read_bytes()

    async def ask(roots: bytes | None) -> int:
        async with MetadataClient(target, credentials=credentials, root_certificates=roots, timeout_s=5) as client:
            return (await client.stats()).live_nodes

    assert asyncio.run(ask(ca)) >= 2
    with pytest.raises(grpc.aio.AioRpcError):
        asyncio.run(ask(None))


HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
"""What a plain-text gRPC client sends first: the HTTP/2 preface and an empty SETTINGS frame."""


def test_ray_between_hosts_is_mutual_tls_of_the_cluster_ca(ray_up_cluster: RayUpCluster, tmp_path: Path) -> None:
    """The head's GCS, which every raylet and driver dials, answers only TLS: with a certificate of
    the cluster CA naming the head's address, and only to a client presenting one of the same CA
    (Ray's mutual TLS, `radixmesh ray-tls` in the YAML); plain-text gRPC gets no HTTP/2 answer."""
    c = ray_up_cluster
    head = c.head.address
    secret = ClusterSecret.from_hex((c.home / ".radixmesh" / "secret").read_text())
    ca = ClusterCa.derive(secret)
    mine = ca.issue(["tester"], client=True)
    (tmp_path / "me.pem").write_bytes(mine.cert_chain)
    (tmp_path / "me.key").write_bytes(mine.private_key)

    def handshake(with_cert: bool) -> bytes:
        ctx = ssl.create_default_context(cadata=ca.certificate.decode())
        ctx.set_alpn_protocols(["h2"])
        if with_cert:
            ctx.load_cert_chain(tmp_path / "me.pem", tmp_path / "me.key")
        with socket.create_connection((head, 6379), timeout=10) as raw, \
                ctx.wrap_socket(raw, server_hostname=head) as tls:  # verifies the chain and the head's address
            tls.sendall(HTTP2_PREFACE)
            try:
                return tls.recv(64)
            except (ssl.SSLError, ConnectionResetError):
                return b""

    answer = handshake(with_cert=True)
    assert len(answer) >= 9 and answer[3] == 4, answer  # the server's SETTINGS frame: a gRPC server spoke
    assert handshake(with_cert=False) == b""  # TLS 1.3 reports the refused client certificate on first read
    with socket.create_connection((head, 6379), timeout=10) as plain:
        plain.sendall(HTTP2_PREFACE)
        reply = plain.recv(64)
    assert not (len(reply) >= 9 and reply[3] == 4), reply  # no HTTP/2 in plain text (a TLS alert, or closed)


def test_a_host_that_joins_gets_an_agent_and_traffic(ray_up_cluster: RayUpCluster) -> None:
    c = ray_up_cluster
    host = c.add_host()
    c.join(host)
    node = agent_of(host)
    wait_for(f"agent {node} in the router", lambda: node in router_nodes(c) or None, 240, c.logs)

    conversations = itertools.count()

    def served() -> bool:
        # Each a new conversation from its first block on: prompts that began alike ("A new
        # conversati...") all went to the node caching that block, as the router keeps a cached prefix
        # on an idle cluster, and the new host got traffic only when the load cap sent it some.
        complete(c, f"{next(conversations)}-{id(c)}: a new conversation", max_tokens=2)
        return router_nodes(c)[node]["requests"] > 0

    wait_for(f"{node} serving", served, 60)


def test_a_partitioned_host_keeps_requests_succeeding_and_serves_again_after_heal(
        ray_up_cluster: RayUpCluster) -> None:
    c = ray_up_cluster
    host = c.hosts[2]
    node = agent_of(host)
    complete(c, f"{PREFIX} before the partition")
    live = wait_for("the metadata service's stats", lambda: live_nodes(c), 60)
    with steady_traffic(c, "partition") as failures:
        c.network.partition(host)
        try:
            # Its heartbeats stop: the lease ends and the index forgets the node's blocks.
            wait_for(f"{node}'s lease to end", lambda: live_nodes(c) == live - 1 or None, 60)
        finally:
            c.network.heal(host)
        wait_for(f"{node} to register again", lambda: live_nodes(c) == live or None, 120)
    assert not failures, failures
    before = router_nodes(c)[node]

    def served_again() -> bool:
        # Prompts of their own from the first block (nothing cached anywhere) and long enough to be
        # work: a short one is cheapest where a peer caches a shared start, and brings that peer too
        # little work for the load cap (which counts computed tokens) to send the next one elsewhere.
        n = sum(v["requests"] for v in router_nodes(c).values())
        complete(c, f"{n:06d}: after the heal, a conversation of its own. " + "Tell me more. " * 40, max_tokens=2)
        return router_nodes(c)[node]["requests"] > before["requests"]

    wait_for(f"{node} serving after the heal", served_again, 120,
             lambda: f"router's view: {router_nodes(c)}\n{c.logs()}")
    after = router_nodes(c)[node]
    # What the index promised on this node since the heal was there: no entry for a block it lacks.
    assert (after["realized_local_tokens"] - before["realized_local_tokens"]
            == after["predicted_local_tokens"] - before["predicted_local_tokens"])


def live_nodes(c: RayUpCluster) -> int | None:
    """Nodes holding a metadata lease (the service's GetStats, through the router's /stats); None
    while the router could not ask the service (its /stats then says metadata: null, degraded), as a
    busy box makes it now and then: the callers poll again."""
    meta = c.get("/stats")["metadata"]
    return None if meta is None else int(meta["live_nodes"])


def test_a_killed_host_fails_no_request_and_leaves_the_index(ray_up_cluster: RayUpCluster) -> None:
    c = ray_up_cluster
    host = c.hosts[1]
    node = agent_of(host)
    live = wait_for("the metadata service's stats", lambda: live_nodes(c), 60)
    with steady_traffic(c, "kill") as failures:
        c.network.kill_processes(host)
        wait_for(f"{node}'s lease to end", lambda: live_nodes(c) == live - 1 or None, 60)
        # Ray declares the host dead; the reconcile loop then drops its agent for good.
        wait_for(f"{node}'s agent to be dropped", lambda: f"radixmesh-agent-{node}" not in c.agent_actors() or None, 120)
    assert not failures, failures
    # Hit rate recovers on the hosts that are left: a repeated prefix is served from cache.
    prompt = f"{PREFIX} after the kill"
    complete(c, prompt)
    assert cached_tokens(complete(c, prompt)) > 0
