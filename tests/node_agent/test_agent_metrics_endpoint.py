"""Each agent's own /metrics, the router's file-SD target list over them, and the router's access log
(real agents, a real aiohttp router on 127.0.0.1)."""

import json
import logging
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from radixmesh.cluster.api.app import start_http
from radixmesh.cluster.fleet.agent_client import LocalAgentClient, StaticAgentDirectory
from radixmesh.cluster.launch import launcher
from radixmesh.cluster.launch.config import LauncherConfig
from radixmesh.cluster.observability.file_sd import TOKEN_FILE, FileSdConfig, FileSdPublisher
from radixmesh.cluster.policy.base import PolicyConfig
from radixmesh.cluster.router.router import Router
from radixmesh.common.metrics.scrape import MetricsServer, metrics_token
from radixmesh.common.metrics.scrape_cache import ScrapeCache
from radixmesh.node_agent.agent import NodeAgent
from radixmesh.proto.ids import NodeId
from tests.support.router_cluster import MODEL_NAME, SECRET, agent_config, router_config

pytestmark = [pytest.mark.integration]


@dataclass
class Deployed:
    url: str
    targets: Path
    router: Router
    agents: list[NodeAgent]


@pytest.fixture
async def deployed(tmp_path: Path) -> AsyncIterator[Deployed]:
    agents = [NodeAgent(replace(agent_config(n), metrics_port=0)) for n in ("a", "b")]
    for a in agents:
        await a.start()
    layout = agents[0].layout
    config = router_config(layout.fingerprint(), policy_config=PolicyConfig(block_bytes=layout.block_bytes))
    router = Router(config, StaticAgentDirectory([LocalAgentClient(a) for a in agents]), None, rng=random.Random(0))
    targets = tmp_path / "prometheus" / "targets.json"
    file_sd = FileSdConfig(targets, interval_s=3600, metrics_token=metrics_token(SECRET))
    runner, port = await start_http(router, "127.0.0.1", 0, file_sd=file_sd)
    try:
        yield Deployed(f"http://127.0.0.1:{port}", targets, router, agents)
    finally:
        await runner.cleanup()
        for a in agents:
            await a.stop()


def samples(text: str, name: str) -> list[dict[str, str]]:
    return [s.labels for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]


@pytest.mark.anyio
async def test_file_sd_lists_the_router_and_each_agent_scrapeable_once(deployed: Deployed) -> None:
    groups = json.loads(deployed.targets.read_text())
    router, *agents = groups
    assert router["labels"] == {"role": "router", "availability_zone": "", "__param_scope": "router"}
    assert [g["labels"]["node"] for g in agents] == ["a", "b"]
    assert all(g["labels"]["role"] == "agent" for g in agents)
    assert (deployed.targets.parent / TOKEN_FILE).stat().st_mode & 0o777 == 0o600
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{deployed.url}/v1/completions",
                             json={"model": MODEL_NAME, "prompt": "hello there", "max_tokens": 2}) as r:
            assert r.status == 200
        served = 0
        for g in agents:
            [address] = g["targets"]
            async with http.get(f"http://{address}/metrics") as r:
                assert r.status == 200
                own = samples(await r.text(), "radixmesh_agent_requests_total")
            assert [s["node"] for s in own] == [g["labels"]["node"]]
            assert own[0]["model_name"] == MODEL_NAME
            served += 1
        assert served == 2
        # The router's target leaves out the agents Prometheus scrapes itself; the plain scrape keeps them.
        async with http.get(f"{deployed.url}/metrics", params={"scope": "router"}) as r:
            scoped = await r.text()
        async with http.get(f"{deployed.url}/metrics") as r:
            merged = await r.text()
    assert samples(scoped, "radixmesh_agent_requests_total") == []
    assert samples(scoped, "radixmesh_router_requests_total")
    assert {s["node"] for s in samples(merged, "radixmesh_agent_requests_total")} == {"a", "b"}


@pytest.mark.anyio
async def test_a_stopped_agent_leaves_the_target_list(deployed: Deployed, tmp_path: Path) -> None:
    path = tmp_path / "other" / "targets.json"
    publisher = FileSdPublisher(deployed.router, FileSdConfig(path))
    await publisher.listen_at("127.0.0.1:1")
    assert [g["labels"].get("node") for g in json.loads(path.read_text())] == [None, "a", "b"]
    await deployed.agents[1].stop()
    await publisher.refresh()
    assert [g["labels"].get("node") for g in json.loads(path.read_text())] == [None, "a"]
    assert deployed.router.scraped_nodes == {"a"}  # b's metrics come through the router's target again
    assert not (path.parent / TOKEN_FILE).exists()  # no token given, none written


@pytest.mark.anyio
async def test_the_token_file_is_never_written_through_a_planted_link(deployed: Deployed, tmp_path: Path) -> None:
    """Issue 38 item 12: a symlink planted at the file written aside sent the token where it pointed."""
    folder = tmp_path / "planted"
    folder.mkdir(mode=0o755)
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    (folder / f".{TOKEN_FILE}.tmp").symlink_to(victim)
    (folder / TOKEN_FILE).symlink_to(victim)
    publisher = FileSdPublisher(deployed.router, FileSdConfig(folder / "targets.json", metrics_token="tok"))
    await publisher.listen_at("127.0.0.1:1")
    token = folder / TOKEN_FILE
    assert victim.read_text() == "untouched"
    assert not token.is_symlink() and token.read_text() == "tok" and token.stat().st_mode & 0o777 == 0o600
    made = tmp_path / "new" / "prometheus"  # a folder it makes itself is private
    await FileSdPublisher(deployed.router, FileSdConfig(made / "targets.json", metrics_token="tok")).listen_at("x:1")
    assert made.stat().st_mode & 0o777 == 0o700
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # anyone may plant names here: refused, nothing written
    with pytest.raises(PermissionError, match="others cannot write"):
        await FileSdPublisher(deployed.router, FileSdConfig(shared / "targets.json", metrics_token="tok")
                              ).listen_at("127.0.0.1:1")
    assert list(shared.iterdir()) == []


@pytest.mark.anyio
async def test_off_loopback_an_agent_metrics_endpoint_needs_the_token() -> None:
    async def render() -> str:
        return "# TYPE radixmesh_x gauge\nradixmesh_x 1.0\n"

    with pytest.raises(ValueError, match="metrics token"):
        MetricsServer(render, "10.1.2.3", 0, None)
    token = metrics_token(SECRET)
    server = MetricsServer(render, "127.0.0.1", 0, token)
    address = await server.start()
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://{address}/metrics") as r:
                assert r.status == 401
            async with http.get(f"http://{address}/metrics", headers={"Authorization": "Bearer wrong"}) as r:
                assert r.status == 401
            async with http.get(f"http://{address}/metrics", headers={"Authorization": f"Bearer {token}"}) as r:
                assert r.status == 200 and "radixmesh_x 1.0" in await r.text()
    finally:
        await server.stop()


@pytest.mark.anyio
async def test_a_scrape_flood_on_an_agent_renders_once_a_second() -> None:
    """Issue 38 item 14: every GET of an agent's own /metrics rendered on its engine thread."""
    renders = 0
    now = [0.0]

    async def render() -> str:
        nonlocal renders
        renders += 1
        return f"# TYPE radixmesh_x gauge\nradixmesh_x {renders}.0\n"

    server = MetricsServer(render, "127.0.0.1", 0, None, ScrapeCache(clock=lambda: now[0]))
    address = await server.start()
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(50):
                async with http.get(f"http://{address}/metrics") as r:
                    assert r.status == 200 and "radixmesh_x 1.0" in await r.text()
            now[0] = 1.0  # a second later: one new render for the next scrape
            async with http.get(f"http://{address}/metrics") as r:
                assert "radixmesh_x 2.0" in await r.text()
        assert renders == 2
    finally:
        await server.stop()


@pytest.mark.anyio
async def test_access_log_has_one_line_per_request_with_its_node_and_cached_tokens(
        deployed: Deployed, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="radixmesh.access")
    body = {"model": MODEL_NAME, "prompt": "A prompt long enough for a full block or two of bytes.",
            "max_tokens": 2}
    async with aiohttp.ClientSession() as http:
        for _ in range(2):
            async with http.post(f"{deployed.url}/v1/completions", json=body) as r:
                doc = await r.json()
        async with http.post(f"{deployed.url}/v1/completions", json={**body, "n": 0}) as r:
            assert r.status == 400
    lines = [r.getMessage() for r in caplog.records if r.name == "radixmesh.access"]
    assert len(lines) == 3
    assert lines[1].startswith("POST /v1/completions 200 ")
    assert f"id={doc['id']} " in lines[1]
    assert " node=a " in lines[1] or " node=b " in lines[1]
    cached = doc["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert lines[1].endswith(f"cached_tokens={cached}")
    assert lines[2].startswith("POST /v1/completions 400 ") and lines[2].endswith("node=- cached_tokens=-")


def test_log_level_is_the_ray_jobs_logging_config_and_bad_levels_are_refused() -> None:
    config = LauncherConfig(local_nodes=1, log_level="debug")
    assert launcher.job_runtime_env(config)["env_vars"] == {"RADIXMESH_LOG_LEVEL": "DEBUG"}
    with pytest.raises(ValueError, match="log_level must be one of DEBUG"):
        LauncherConfig(local_nodes=1, log_level="loud")
    assert config.agent_config(NodeId("n"), "127.0.0.1:1", "127.0.0.1").metrics_port is None
    scraped = replace(config, prometheus_dir=Path("/tmp/x"))
    assert scraped.agent_config(NodeId("n"), "127.0.0.1:1", "127.0.0.1").metrics_port == 0
