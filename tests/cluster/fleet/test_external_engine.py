"""External engines as nodes, end to end: fake vLLM engines in their own processes (real aiohttp
OpenAI servers, real ZMQ event frames built to vLLM's schema), their events ingested into a real
metadata gRPC service, and the router serving through their /v1/completions with `cost_no_pull`."""

import asyncio
import contextlib
import dataclasses
import json
import random
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from radixmesh.cluster.fleet.agent_client import AgentUnavailable, StaticAgentDirectory
from radixmesh.cluster.fleet.engine_client import EngineAgentClient
from radixmesh.cluster.fleet.external_fleet import ExternalFleet
from radixmesh.cluster.fleet.ingest.external_engine import ExternalEngine, ExternalEngineConfig
from radixmesh.cluster.fleet.ingest.subscriber import SubscriberConfig
from radixmesh.cluster.metadata.server import MetadataServer
from radixmesh.cluster.metadata.service import MetadataService
from radixmesh.cluster.router.config import RouterConfig
from radixmesh.cluster.router.router import Router
from radixmesh.common.metadata.auth import CallerCredentials
from radixmesh.common.metadata.client import MetadataClient
from radixmesh.common.metadata.publisher import PublisherConfig
from radixmesh.common.secret import ClusterSecret
from radixmesh.proto.block_hash import hash_blocks, tenant_salt
from radixmesh.proto.ids import NodeId
from radixmesh.proto.metadata.messages import MatchQuery
from radixmesh.proto.serve.limits import InvalidRequest, PromptLimits
from radixmesh.proto.serve.plan import ServePlan, ServeResult
from radixmesh.proto.serve.sampling import SamplingParams
from tests.support.poll import until
from tests.support.servers import free_port, start_metadata_server

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

BS = 4
LAYOUT = "vllm:fake-model:bs4"
SECRET = ClusterSecret.generate()
FAKE = Path(__file__).parents[2] / "support" / "fake_vllm_engine.py"


@dataclass
class FakeEngineProcess:
    process: asyncio.subprocess.Process
    url: str
    pub: str
    replay: str | None


@contextlib.asynccontextmanager
async def fake_engine(*args: str) -> AsyncIterator[FakeEngineProcess]:
    process = await asyncio.create_subprocess_exec(sys.executable, str(FAKE), "--block-size", str(BS), *args,
                                                   stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
    assert process.stdout is not None and process.stdin is not None
    try:
        async with asyncio.timeout(30):
            ports = json.loads(await process.stdout.readline())
        replay = f"tcp://127.0.0.1:{ports['replay_port']}" if ports["replay_port"] else None
        yield FakeEngineProcess(process, f"http://127.0.0.1:{ports['http_port']}",
                                f"tcp://127.0.0.1:{ports['pub_port']}", replay)
    finally:
        process.stdin.close()
        try:
            async with asyncio.timeout(10):
                await process.wait()
        except TimeoutError:
            process.kill()
            await process.wait()


@dataclass
class Fleet:
    service: MetadataService
    engines: dict[NodeId, ExternalEngine]
    clients: dict[NodeId, EngineAgentClient]
    fakes: dict[str, FakeEngineProcess]
    router: Router
    metadata: MetadataClient
    http: aiohttp.ClientSession

    def holds(self, node: str, prompt: list[int], tenant: str = "") -> int:
        """Leading blocks of `prompt` the index says `node` holds on the gpu."""
        hashes = tuple(hash_blocks(prompt, BS, salt=tenant_salt(tenant)))
        [result] = self.service.match([MatchQuery(LAYOUT, hashes, tenant, include_all_nodes=True)])
        return next((m.gpu_blocks for m in result.nodes if m.node_id == node), -1)

    async def serve_directly(self, node: str, prompt: list[int], tenant: str = "") -> ServeResult:
        """Traffic that reaches the engine without passing through our router."""
        plan = ServePlan(f"direct-{random.random()}", tuple(prompt), SamplingParams(max_tokens=2, seed=1), tenant)
        items = [item async for item in self.clients[node].serve(plan)]
        assert isinstance(items[-1], ServeResult)
        return items[-1]

    async def control(self, node: str, path: str, body: object = None) -> None:
        async with self.http.post(f"{self.fakes[node].url}{path}", json=body) as r:
            assert r.status == 200, await r.text()


def engine_config(name: str, fake: FakeEngineProcess) -> ExternalEngineConfig:
    return ExternalEngineConfig(
        NodeId(name), fake.url, SubscriberConfig(fake.pub, fake.replay), LAYOUT, "fake-model", block_size=BS,
        block_bytes=4096, capacity_blocks=64, publisher=PublisherConfig(publish_interval_s=0.01, heartbeat_interval_s=0.1))


@contextlib.asynccontextmanager
async def fleet() -> AsyncIterator[Fleet]:
    """Engine "plain" (no replay socket) and engine "replayed" (with one), both publishing vLLM
    main's map encoding; a metadata service that admits only holders of SECRET; the router."""
    service = MetadataService()
    server: MetadataServer
    server, port = await start_metadata_server(service, secret=SECRET)
    target = f"127.0.0.1:{port}"
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(server.stop, 0)
        http = await stack.enter_async_context(aiohttp.ClientSession())
        fakes = {"plain": await stack.enter_async_context(fake_engine()),
                 "replayed": await stack.enter_async_context(fake_engine("--replay"))}
        external = ExternalFleet([engine_config(name, fake) for name, fake in fakes.items()],
                                 lambda node: MetadataClient(target, credentials=CallerCredentials.node(SECRET, node)))
        await external.start()
        stack.push_async_callback(external.stop)
        engines, clients = external.engines, external.clients
        metadata = MetadataClient(target, credentials=CallerCredentials.cluster(SECRET))
        stack.push_async_callback(metadata.close)
        config = RouterConfig(LAYOUT, block_size=BS, policy="cost_no_pull", model_name="fake-model",
                              limits=PromptLimits(vocab_size=256, max_context_tokens=1024), metadata_retry_s=0.0)
        router = Router(config, StaticAgentDirectory(clients.values()), metadata, rng=random.Random(0))
        f = Fleet(service, engines, clients, fakes, router, metadata, http)
        for name in fakes:
            await until(lambda n=name: len(service.membership.members()) == 2 and _subscribed(f, n), f"{name} joins")
        await _wait_subscribers(f)
        yield f
        router.check_invariants()
        for engine in engines.values():
            engine.node.blocks.check_invariants()
        service.check_invariants()


def _subscribed(f: Fleet, name: str) -> bool:
    return f.engines[name].publisher is not None and f.engines[name].publisher.lease is not None


async def _wait_subscribers(f: Fleet) -> None:
    for fake in f.fakes.values():
        await wait_subscribed(f.http, fake)


async def wait_subscribed(http: aiohttp.ClientSession, fake: FakeEngineProcess) -> None:
    """The fake engine saw our SUB socket's subscription (a PUB drops what it sends before that)."""
    async with asyncio.timeout(15):
        while True:
            async with http.get(f"{fake.url}/control/subscribers") as r:
                if (await r.json())["subscribers"] >= 1:
                    return
            await asyncio.sleep(0.01)


SYSTEM = list(range(1, 41))
"""A 40-token shared prefix: 10 blocks."""


async def test_the_index_learns_an_engines_blocks_and_the_router_follows_them() -> None:
    async with fleet() as f:
        first = await f.serve_directly("plain", [*SYSTEM, 200, 201], tenant="acme")
        assert first.stats.tokens.local_gpu == 0
        await until(lambda: f.holds("plain", SYSTEM, "acme") == 10, "the index learns plain's 10 blocks")
        assert f.holds("replayed", SYSTEM, "acme") == 0
        assert f.holds("plain", SYSTEM) == 0  # cache_salt kept the tenant's chain apart

        prompt = (*SYSTEM, 50, 51, 52, 53, 54)
        result = await f.router.complete(ServePlan("shared", prompt, SamplingParams(max_tokens=3, seed=5),
                                                         tenant="acme"))
        assert result.routed.decision.node == "plain" and result.routed.policy == "cost_no_pull"
        assert result.routed.plan.pull is None
        assert result.result.stats.tokens.local_gpu == 40  # realized: usage.prompt_tokens_details.cached_tokens
        assert result.result.output_token_ids == tuple((5 + i + 54) % 256 for i in range(3))
        # The engine's heartbeats carry the realized hits and its /metrics load into the service.
        await until(lambda: f.service.stats().hits.per_node.get("plain") is not None
                    and f.service.stats().hits.per_node["plain"].local_gpu_tokens == 40, "hits reported")
        await f.control("plain", "/control/waiting", {"n": 3})
        await until(lambda: f.service.membership.get(NodeId("plain")).load.queued_requests == 3,  # type: ignore[union-attr]
                    "load from /metrics")


async def test_a_sequence_gap_without_replay_forgets_then_rebuilds() -> None:
    async with fleet() as f:
        await f.serve_directly("plain", [*SYSTEM, 9])
        await until(lambda: f.holds("plain", SYSTEM) == 10, "plain's blocks")
        other = list(range(100, 120))
        await f.control("plain", "/control/lose_next_batch")
        await f.serve_directly("plain", other)  # its BlockStored batch is lost on the way
        longer = [*SYSTEM, *range(60, 68)]
        await f.serve_directly("plain", longer)  # the next batch shows the gap
        await until(lambda: f.engines["plain"].subscriber.stats.gaps == 1, "the gap is seen")
        # Forgotten and rebuilt from what followed: the new blocks' request holds their prefix, so
        # SYSTEM is back; the lost batch's blocks stay unknown (never a block the engine lacks).
        await until(lambda: f.holds("plain", longer) == 12, "rebuilt from the next batch")
        assert f.holds("plain", other) == 0
        assert f.engines["plain"].subscriber.stats.forgets == 1
        metrics = await f.clients["plain"].prometheus_text()
        assert "vllm:kv_cache_usage_perc" in metrics and 'radixmesh_kv_event_gaps_total{model_name="fake-model"} 1.0' in metrics
        assert 'radixmesh_external_engine_blocks{model_name="fake-model"} 12.0' in metrics


async def test_a_sequence_gap_is_filled_from_vllms_replay_socket() -> None:
    async with fleet() as f:
        await f.serve_directly("replayed", [*SYSTEM, 9])
        await until(lambda: f.holds("replayed", SYSTEM) == 10, "replayed's blocks")
        other = list(range(100, 120))
        await f.control("replayed", "/control/lose_next_batch")
        await f.serve_directly("replayed", other)
        await f.serve_directly("replayed", [*range(200, 208)])
        await until(lambda: f.holds("replayed", [*range(200, 208)]) == 2, "the batch after the gap")
        assert f.holds("replayed", other) == 5 and f.holds("replayed", SYSTEM) == 10  # nothing lost
        stats = f.engines["replayed"].subscriber.stats
        assert stats.gaps == 1 and stats.forgets == 0 and stats.replays >= 1


async def test_all_blocks_cleared_empties_the_engine_in_the_index() -> None:
    async with fleet() as f:
        await f.serve_directly("plain", [*SYSTEM, 9])
        await until(lambda: f.service.index.node_block_count(NodeId("plain")) == 10, "plain's blocks")
        await f.control("plain", "/reset_prefix_cache")
        await until(lambda: f.service.index.node_block_count(NodeId("plain")) == 0, "AllBlocksCleared")
        assert f.holds("plain", SYSTEM) == 0 and "plain" in f.service.index.nodes()  # still a live node
        await until(lambda: f.service.membership.get(NodeId("plain")).load.free_blocks == 64,  # type: ignore[union-attr]
                    "the engine's /metrics shows an empty cache")


async def test_the_engine_client_maps_refusals_and_dead_engines() -> None:
    async with fleet() as f:
        client = f.clients["plain"]
        with pytest.raises(InvalidRequest, match="token ids"):
            [i async for i in client.serve(ServePlan("bad", (), SamplingParams(max_tokens=1)))]
        body = client.request_body(ServePlan("r", (1, 2), SamplingParams(max_tokens=4, seed=9, stop=("x",)), "t"))
        assert body["cache_salt"] == "t" and body["seed"] == 9 and body["return_token_ids"] is True
        assert body["stream_options"] == {"include_usage": True} and body["stop"] == ["x"]
        assert "vllm:kv_cache_usage_perc" in await client.prometheus_text()
        gone = EngineAgentClient(dataclasses.replace(client.config, openai_url=f"http://127.0.0.1:{free_port()}"))
        try:
            with pytest.raises(AgentUnavailable):
                [i async for i in gone.serve(ServePlan("lost", (1, 2, 3), SamplingParams(max_tokens=1)))]
            with pytest.raises(AgentUnavailable):
                await gone.prometheus_text()
        finally:
            await gone.close()


async def test_an_engine_publishing_vllm_0_11_array_frames_is_followed() -> None:
    # vLLM <= 0.11 (and SGLang) encode array_like structs and carry no extra keys: no cache_salt.
    async with fake_engine("--encoding", "array") as fake:
        external = ExternalFleet([engine_config("old", fake)], None)
        [client] = await external.start()
        try:
            async with aiohttp.ClientSession() as http:
                await wait_subscribed(http, fake)
            plan = ServePlan("old-1", (*SYSTEM, 7), SamplingParams(max_tokens=1, seed=0))
            [item async for item in client.serve(plan)]
            blocks = external.engines[NodeId("old")].node.blocks
            await until(lambda: len(blocks) == 10, "the array-encoded batch")
            assert blocks.chains()[0].hashes == tuple(hash_blocks(SYSTEM, BS))
        finally:
            await external.stop()


@pytest.mark.slow
async def test_radixmesh_front_serves_the_openai_api_over_fake_engines() -> None:
    async with fake_engine() as a, fake_engine("--replay") as b:
        specs = [f"name=a,url={a.url},events={a.pub}", f"name=b,url={b.url},events={b.pub},replay={b.replay}"]
        args = [sys.executable, "-m", "radixmesh.cluster.cli", "front", "--model", "fake-model", "--block-size",
                str(BS), "--port", "0"]
        for spec in specs:
            args += ["--engine", spec]
        process = await asyncio.create_subprocess_exec(*args, stdout=asyncio.subprocess.PIPE)
        assert process.stdout is not None
        try:
            async with asyncio.timeout(60):
                line = (await process.stdout.readline()).decode()
            assert line.startswith("radixmesh front: http://127.0.0.1:"), line
            api = line.split()[2]
            async with aiohttp.ClientSession() as http:
                for fake in (a, b):
                    await wait_subscribed(http, fake)
                body = {"model": "fake-model", "prompt": [*SYSTEM, 1], "max_tokens": 2, "cache_salt": "acme"}
                async with http.post(f"{api}/completions", json=body) as r:
                    assert r.status == 200, await r.text()
                    first = await r.json()
                assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0

                # Once the engine's events reach the index, the sibling goes where its prefix is.
                async with asyncio.timeout(15):
                    while True:
                        async with http.get(f"{api[:-len('/v1')]}/stats") as r:
                            if (await r.json())["metadata"]["indexed_blocks"] >= 10:
                                break
                        await asyncio.sleep(0.02)
                async with http.post(f"{api}/completions", json={**body, "prompt": [*SYSTEM, 2, 3]}) as r:
                    assert r.status == 200, await r.text()
                    assert (await r.json())["usage"]["prompt_tokens_details"]["cached_tokens"] == 40
                async with http.post(f"{api}/completions", json={**body, "model": "other"}) as r:
                    assert r.status == 404
                async with http.get(f"{api[:-len('/v1')]}/metrics") as r:
                    text = await r.text()
                assert "radixmesh_external_engine_blocks" in text and "vllm:kv_cache_usage_perc" in text
        finally:
            process.send_signal(signal.SIGINT)
            async with asyncio.timeout(30):
                assert await process.wait() == 0


@pytest.mark.slow
def test_radixmesh_front_refuses_a_bad_engine_spec() -> None:
    run = subprocess.run([sys.executable, "-m", "radixmesh.cluster.cli", "front", "--model", "m", "--engine",
                          "name=a,url=http://127.0.0.1:1"], capture_output=True, text=True, check=False, timeout=120)
    assert run.returncode == 2 and "lacks events" in run.stderr
