"""TLS by default beyond loopback (issue 38, item 16): `up` mints the servers' certificate from the
cluster CA; a server with it refuses plain text and clients of other CAs, while clients that trust
the CA (agents, the router, `radixmesh stats`) get through."""

import asyncio
import ssl
from pathlib import Path

import aiohttp
import grpc
import pytest

from radixmesh.cluster.api.app import server_tls_pem, start_http
from radixmesh.cluster.bench.arms import ARMS, RunningCluster, Target
from radixmesh.cluster.cli.route_stats import _fetch, client_access
from radixmesh.cluster.launch.cluster_record import ca_file_path
from radixmesh.cluster.launch.config import LauncherConfig
from radixmesh.cluster.launch.tls import scrape_ca, with_tls
from radixmesh.cluster.metadata.server import TlsFiles
from radixmesh.cluster.observability.file_sd import file_sd_groups
from radixmesh.cluster.sim.router_client import ClientAccess, router_decisions, router_stats
from radixmesh.cluster.sim.trace import TraceRequest
from radixmesh.cluster.sim.trace_replay import ReplayConfig, replay
from radixmesh.common.cluster_ca import ClusterCa
from radixmesh.common.metadata.auth import CallerCredentials
from radixmesh.common.metadata.client import MetadataClient
from radixmesh.common.metrics.scrape import MetricsServer, ScrapeTarget, metrics_token
from radixmesh.common.secret import ClusterSecret
from radixmesh.proto.ids import NodeId
from tests.common.test_cluster_ca import operator_ca, verify
from tests.support.router_cluster import local_cluster
from tests.support.servers import start_metadata_server
from tests.support.tiny_model import BS, MODEL_NAME

pytestmark = pytest.mark.anyio
SECRET = ClusterSecret(bytes(range(32)))
HEAD = "198.18.0.1"
AGENT = "198.18.0.2"


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RADIXMESH_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def minted(address: str, secret: ClusterSecret = SECRET) -> TlsFiles:
    served = ClusterCa.derive(secret).issue([address])
    return TlsFiles(served.cert_chain, served.private_key, served.ca)


def test_up_beyond_loopback_serves_tls_with_a_certificate_of_the_secrets_ca() -> None:
    config = with_tls(LauncherConfig(host=HEAD, api_key="sk-k", secret=SECRET), HEAD)
    assert config.tls is not None and config.tls.trust == ClusterCa.derive(SECRET).certificate
    verify(ClusterCa.derive(SECRET).issue([HEAD])._replace(cert_chain=config.tls.cert_chain), config.tls.trust)
    assert config.agent_config(config.node_ids(1)[0], "m:1", HEAD).metadata_root_certificates == config.tls.trust
    assert ca_file_path().read_bytes() == config.tls.trust  # what `radixmesh stats` trusts


def test_loopback_and_no_tls_stay_plain_text() -> None:
    assert with_tls(LauncherConfig(host="127.0.0.1", secret=SECRET), "127.0.0.1").tls is None
    assert with_tls(LauncherConfig(host=HEAD, api_key="sk-k", secret=SECRET, tls_default=False), HEAD).tls is None
    assert not ca_file_path().exists()


def test_a_tls_dir_mints_from_the_operators_ca(tmp_path: Path) -> None:
    pem = operator_ca(tmp_path)
    config = with_tls(LauncherConfig(host=HEAD, api_key="sk-k", secret=SECRET, tls_dir=tmp_path), HEAD)
    assert config.tls is not None and config.tls.trust == pem
    leaf = config.tls.cert_chain
    verify(ClusterCa.derive(SECRET).issue([HEAD])._replace(cert_chain=leaf), pem)


async def test_the_metadata_service_refuses_plain_text_and_other_cas() -> None:
    tls = minted("127.0.0.1")
    server, port = await start_metadata_server(secret=SECRET, tls=tls)
    cluster = CallerCredentials.cluster(SECRET)
    try:
        for target in (f"127.0.0.1:{port}", f"ipv4:127.0.0.1:{port}"):  # one address, and a failover list
            async with MetadataClient(target, credentials=cluster, root_certificates=tls.trust) as trusting:
                assert (await trusting.stats()).live_nodes == 0
        others = minted("127.0.0.1", ClusterSecret(bytes(range(1, 33)))).trust
        for roots in (None, others):  # plain text; a client of another cluster's CA
            async with MetadataClient(f"127.0.0.1:{port}", credentials=cluster, root_certificates=roots,
                                      timeout_s=2) as refused:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await refused.stats()
                assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await server.stop(None)


async def test_the_api_refuses_plain_text_and_radixmesh_stats_trusts_the_ca_up_wrote() -> None:
    tls = with_tls(LauncherConfig(host="127.0.0.1", secret=SECRET, tls=minted("127.0.0.1")), "127.0.0.1").tls
    assert tls is not None
    async with local_cluster(1) as c:
        runner, port = await start_http(c.router, "127.0.0.1", 0, tls=server_tls_pem(tls.cert_chain, tls.private_key))
        try:
            assert "router" in await _fetch_off_loop(f"https://127.0.0.1:{port}")
            async with aiohttp.ClientSession() as http:
                with pytest.raises(aiohttp.ClientError):  # plain HTTP gets no answer from a TLS port
                    await http.get(f"http://127.0.0.1:{port}/healthz")
                with pytest.raises(aiohttp.ClientConnectorCertificateError):  # nor a client of the system's roots
                    await http.get(f"https://127.0.0.1:{port}/healthz", ssl=ssl.create_default_context())
        finally:
            await runner.cleanup()


async def test_replay_and_bench_reach_a_keyed_tls_router_as_radixmesh_stats_does(monkeypatch: pytest.MonkeyPatch) -> None:
    # Beyond loopback a router wants its key and serves TLS from the cluster CA: `replay --url` and
    # `bench --url` sent neither, so they could only measure loopback deployments. Now every client
    # command presents RADIXMESH_API_KEY and trusts the CA `up` wrote.
    tls = with_tls(LauncherConfig(host="127.0.0.1", secret=SECRET, tls=minted("127.0.0.1")), "127.0.0.1").tls
    assert tls is not None
    monkeypatch.setenv("RADIXMESH_API_KEY", "sk-k")
    access = client_access()
    assert access == ClientAccess("sk-k", ca_file_path())
    async with local_cluster(1) as c:
        runner, port = await start_http(c.router, "127.0.0.1", 0, api_key="sk-k",
                                        tls=server_tls_pem(tls.cert_chain, tls.private_key))
        base = f"https://127.0.0.1:{port}"
        try:
            with pytest.raises(aiohttp.ClientResponseError) as refused:  # the CA alone: no key, no stats
                await router_stats(base, ClientAccess(ca_file=ca_file_path()))
            assert refused.value.status == 401
            trace = [TraceRequest(0.0, 3 * BS, 1, (1, 2, 3)), TraceRequest(0.0, 4 * BS, 1, (1, 2, 3, 4))]
            report = await replay(base, trace, ReplayConfig(block_size=BS, max_tokens=1, sequential=True,
                                                            model=MODEL_NAME), access=access)
            assert report.requests == 2 and report.hits_by_source["local_gpu"] == 3 * BS  # the second reused the first's
            async with RunningCluster(base, access).cluster(ARMS["off"]) as target:
                assert target == Target(base, MODEL_NAME, access)  # the served name, read with the key
            assert (await router_decisions(base, 0, access))["last_seq"] >= 2
        finally:
            await runner.cleanup()


async def _fetch_off_loop(base: str) -> dict[str, object]:
    """`radixmesh stats --json`'s fetch (blocking urllib), off the loop that serves the router."""
    return await asyncio.to_thread(_fetch, base)


def test_prometheus_is_told_the_router_and_agents_serve_https() -> None:
    router = ScrapeTarget("198.18.0.1:8000", None, params=(("scope", "router"),), scheme="https")
    agent = ScrapeTarget("198.18.0.2:41877", NodeId("n"), scheme="https")
    local = ScrapeTarget("127.0.0.1:41878", NodeId("m"))
    [r, a, p] = file_sd_groups([router, agent, local])
    assert r["labels"]["__scheme__"] == a["labels"]["__scheme__"] == "https"  # type: ignore[index]
    assert "__scheme__" not in p["labels"]  # type: ignore[operator]  # loopback agents stay http


async def render() -> str:
    return "# TYPE radixmesh_x gauge\nradixmesh_x 1.0\n"


def test_an_agent_beyond_loopback_serves_its_metrics_over_tls_of_the_secrets_ca() -> None:
    """Issue 38 item 16: an agent's own /metrics was plain HTTP off loopback, its bearer token readable."""
    agent = MetricsServer.for_agent(render, AGENT, 0, SECRET)
    assert agent.scheme == "https" and agent.tls is not None
    verify(agent.tls, ClusterCa.derive(SECRET).certificate, AGENT)  # minted on its node, nothing distributed
    assert MetricsServer.for_agent(render, "127.0.0.1", 0, SECRET).scheme == "http"  # loopback: plain, open
    assert MetricsServer.for_agent(render, AGENT, 0, SECRET, tls=False).scheme == "http"  # --no-tls
    node = NodeId("node-0")
    assert LauncherConfig(host=HEAD, api_key="sk-k", secret=SECRET).agent_config(node, "m:1", AGENT).metrics_tls
    plain = LauncherConfig(host=HEAD, api_key="sk-k", secret=SECRET, tls_default=False)
    assert not plain.agent_config(node, "m:1", AGENT).metrics_tls


async def test_an_agents_tls_metrics_refuse_plain_text_and_want_the_token(tmp_path: Path) -> None:
    # The router's ca.pem for Prometheus holds the secret's CA (agents) and, with --tls-dir, the
    # operator's (router, metadata service): both verify.
    operator = operator_ca(tmp_path)
    servers = with_tls(LauncherConfig(host=HEAD, api_key="sk-k", secret=SECRET, tls_dir=tmp_path), HEAD).tls
    assert servers is not None and scrape_ca(servers, SECRET) == ClusterCa.derive(SECRET).certificate + operator
    assert scrape_ca(None, SECRET) == scrape_ca(minted(HEAD), SECRET) == ClusterCa.derive(SECRET).certificate
    prometheus = ssl.create_default_context(cadata=scrape_ca(servers, SECRET).decode())
    token = metrics_token(SECRET)
    server = MetricsServer(render, "127.0.0.1", 0, token, tls=ClusterCa.derive(SECRET).issue(["127.0.0.1"]))
    address = await server.start()
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"https://{address}/metrics", ssl=prometheus,
                                headers={"Authorization": f"Bearer {token}"}) as r:
                assert r.status == 200 and "radixmesh_x 1.0" in await r.text()
            async with http.get(f"https://{address}/metrics", ssl=prometheus) as r:
                assert r.status == 401  # TLS is no credential
            with pytest.raises(aiohttp.ClientError):  # plain HTTP gets no answer
                await http.get(f"http://{address}/metrics", headers={"Authorization": f"Bearer {token}"})
            with pytest.raises(aiohttp.ClientConnectorCertificateError):  # nor a client of other roots
                await http.get(f"https://{address}/metrics", ssl=ssl.create_default_context(
                    cadata=ClusterCa.derive(ClusterSecret(bytes(range(1, 33)))).certificate.decode()))
    finally:
        await server.stop()
