"""POST /reset_prefix_cache (and SGLang's /flush_cache): every agent drops its cached blocks and the
index drops them with it, blocks held by a request or a peer's pull stay, the next request hits
nothing; refused while requests run unless asked to wait; an admin endpoint (issue 30) that only the
admin key derived from the cluster secret opens, paced (issue 38)."""

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from radixmesh.cluster.api.admin import AdminConfig, admin_key
from radixmesh.cluster.api.app import create_app, start_http
from radixmesh.common.block_pool.config import PoolConfig
from radixmesh.common.block_pool.eviction import EVICTION_ORDERS
from radixmesh.node_agent.engine.config import EngineConfig
from radixmesh.node_agent.engine.engine import Engine
from radixmesh.node_agent.engine.request import Request, RequestId
from radixmesh.node_agent.memory.config import MemoryConfig
from radixmesh.proto.events import BlockRemoved, Tier
from radixmesh.proto.ids import NodeId
from radixmesh.proto.serve.plan import ServePlan, TokenDelta
from radixmesh.proto.serve.sampling import SamplingParams
from tests.support.poll import until
from tests.support.router_cluster import MODEL_NAME, SECRET, Cluster, local_cluster
from tests.support.tiny_model import BS, SOURCE

pytestmark = pytest.mark.anyio

PROMPT = "A system prompt long enough to fill a good number of blocks of bytes."
BODY = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 2}
KEY = "api-key"
ADMIN = admin_key(SECRET)
AS_ADMIN = {"Authorization": f"Bearer {ADMIN}"}


@pytest.fixture
async def served() -> AsyncIterator[tuple[Cluster, str]]:
    async with local_cluster(2, publish=True, policy="round_robin") as cluster:
        # No pacing here: these tests reset several times in a row (the pacing has its own test).
        runner, port = await start_http(cluster.router, "127.0.0.1", 0, admin=AdminConfig(ADMIN, 0.0))
        try:
            yield cluster, f"http://127.0.0.1:{port}"
        finally:
            await runner.cleanup()


async def _complete(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with http.post(f"{url}/v1/completions", json=BODY) as r:
        assert r.status == 200
        doc: dict[str, Any] = await r.json()
    return doc


def _cached(doc: dict[str, Any]) -> int:
    return int(doc["usage"]["prompt_tokens_details"]["cached_tokens"])


def _held(cluster: Cluster) -> dict[str, int]:
    return {a.node: a.memory.block_counts(Tier.GPU).cached for a in cluster.agents}


async def test_reset_drops_every_cached_block_and_its_index_entries(served: tuple[Cluster, str]) -> None:
    cluster, url = served
    async with aiohttp.ClientSession() as http:
        for _ in range(4):  # round robin: twice on each node, the second time a hit
            last = await _complete(http, url)
        assert _cached(last) > 0
        held = _held(cluster)
        assert all(held.values())
        index = cluster.service.index
        await until(lambda: all(index.node_block_count(NodeId(n)) for n in held), "the index to hold the blocks")
        async with http.post(f"{url}/reset_prefix_cache", headers=AS_ADMIN) as r:
            assert r.status == 200
            doc = await r.json()
        assert doc == {"status": "ok", "dropped_blocks": sum(held.values()),
                       "nodes": {n: {"status": "reset", "dropped_blocks": {"gpu": k}} for n, k in held.items()}}
        # Each agent published its removals before it answered: the index is empty already.
        assert [index.node_block_count(NodeId(n)) for n in held] == [0, 0]
        assert _held(cluster) == {"a": 0, "b": 0}
        for _ in range(2):  # the next request on each node hits nothing
            assert _cached(await _complete(http, url)) == 0
    for a in cluster.agents:
        await a.check_invariants()


async def test_flush_cache_is_the_same_reset(served: tuple[Cluster, str]) -> None:
    cluster, url = served
    async with aiohttp.ClientSession() as http:
        await _complete(http, url)
        held = sum(_held(cluster).values())
        async with http.post(f"{url}/flush_cache", json={}, headers=AS_ADMIN) as r:
            assert r.status == 200 and (await r.json())["dropped_blocks"] == held > 0
        assert sum(_held(cluster).values()) == 0


async def test_blocks_pinned_by_a_peer_pull_stay_cached_and_indexed(served: tuple[Cluster, str]) -> None:
    cluster, url = served
    async with aiohttp.ClientSession() as http:
        await _complete(http, url)  # round robin: on a
        a = cluster.agent("a")
        gpu = a.memory.gpu  # the transfer plane's handle on memory: a peer's pull pins through it
        chain = [h for h, _ in gpu.cache.snapshot()]
        pinned = await a.runner.call(gpu.cache.match, chain[:3])  # what a peer's pull pins while it streams
        assert len(pinned) == 3
        async with http.post(f"{url}/reset_prefix_cache", headers=AS_ADMIN) as r:
            assert r.status == 200
            assert (await r.json())["nodes"]["a"]["dropped_blocks"] == {"gpu": len(chain) - 3}
        assert [h in gpu.cache for h in chain] == [True] * 3 + [False] * (len(chain) - 3)
        assert cluster.service.index.node_block_count(NodeId("a")) == 3
        await a.runner.call(gpu.cache.release, pinned)
        assert a.memory.block_counts(Tier.GPU).cached == 3  # released, they are ordinary cached blocks again
        await a.check_invariants()


async def test_refused_while_a_request_runs_and_done_after_it_when_asked_to_wait(
        served: tuple[Cluster, str]) -> None:
    cluster, url = served
    async with aiohttp.ClientSession() as http:
        await _complete(http, url)
        held = _held(cluster)
        plan = ServePlan("holder", tuple(range(3, 40)), SamplingParams(max_tokens=300, ignore_eos=True))
        holder = cluster.router.generate(plan)
        assert isinstance(await anext(holder), TokenDelta)  # running until it is closed
        async with http.post(f"{url}/reset_prefix_cache", headers=AS_ADMIN) as r:
            assert r.status == 409
            error = (await r.json())["error"]
        assert error["code"] == "requests_running" and "1 request(s) running" in error["message"]
        assert _held(cluster) == held  # nothing dropped
        async with http.post(f"{url}/reset_prefix_cache", json={"wait": True, "timeout": 0.05}, headers=AS_ADMIN) as r:
            assert r.status == 409 and "still running after 0.05 s" in (await r.json())["error"]["message"]
        waiting = asyncio.ensure_future(http.post(f"{url}/reset_prefix_cache?wait=true", headers=AS_ADMIN))
        async with http.get(f"{url}/health") as r:  # the server got to the reset meanwhile
            assert r.status == 200
        assert not waiting.done() and _held(cluster) == held
        await holder.aclose()
        async with await waiting as r:
            assert r.status == 200
            doc = await r.json()
        # the holder's own prompt blocks were cached when it ended, before the reset ran
        assert doc["dropped_blocks"] >= sum(held.values()) and sum(_held(cluster).values()) == 0


async def test_an_agent_busy_with_another_routers_request_is_reported(served: tuple[Cluster, str]) -> None:
    cluster, url = served
    async with aiohttp.ClientSession() as http:
        await _complete(http, url)
        a = cluster.agent("a")
        plan = ServePlan("elsewhere", tuple(range(3, 40)), SamplingParams(max_tokens=300, ignore_eos=True))
        other = a.serve(plan)  # a request this router does not know of
        assert isinstance(await anext(other), TokenDelta)
        try:
            async with http.post(f"{url}/reset_prefix_cache", headers=AS_ADMIN) as r:
                assert r.status == 409
                doc = await r.json()
        finally:
            await other.aclose()
    assert doc["error"]["code"] == "requests_running"
    assert doc["nodes"]["a"]["status"] == "busy" and "1 request(s) running" in doc["nodes"]["a"]["error"]
    assert doc["nodes"]["b"] == {"status": "reset", "dropped_blocks": {"gpu": 0}}


@pytest.mark.parametrize("query, body, message", [
    ("?wait=maybe", None, "'wait' must be true or false"),
    ("", {"wait": 1}, "'wait' must be true or false"),
    ("?wait=true&timeout=0", None, "'timeout' must be a number"),
    ("", {"wait": True, "timeout": "soon"}, "'timeout' must be a number"),
    ("", {"drop": "all"}, "unrecognized request argument supplied: 'drop'"),
    ("", [], "the body must be a JSON object"),
])
async def test_bad_options_are_refused_and_reset_nothing(served: tuple[Cluster, str], query: str,
                                                         body: object, message: str) -> None:
    cluster, url = served
    async with aiohttp.ClientSession() as http:
        await _complete(http, url)
        held = _held(cluster)
        async with http.post(f"{url}/reset_prefix_cache{query}", json=body, headers=AS_ADMIN) as r:
            assert r.status == 400 and message in (await r.json())["error"]["message"]
        async with http.post(f"{url}/reset_prefix_cache", data="wait", headers={**AS_ADMIN, "Content-Type": "text/plain"}) as r:
            assert r.status == 415
    assert _held(cluster) == held


async def _serve_app(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


async def test_the_reset_needs_the_admin_key_never_the_api_key() -> None:
    """Issue 38 item 2: the tenants' API key (or no key on loopback) used to wipe every tenant's cache."""
    async with local_cluster(1) as cluster:
        apps = {"key": create_app(cluster.router, api_key=KEY, stats_interval_s=None, admin=AdminConfig(ADMIN)),
                "keyless": create_app(cluster.router, stats_interval_s=None, admin=AdminConfig(ADMIN, 0.0)),
                "none": create_app(cluster.router, api_key=KEY, stats_interval_s=None)}
        servers = {name: await _serve_app(app) for name, app in apps.items()}
        try:
            async with aiohttp.ClientSession() as http:
                key, keyless, none = (servers[n][1] for n in ("key", "keyless", "none"))
                await _complete_with(http, key)
                held = _held(cluster)
                for url, headers in ((key, {}), (key, {"Authorization": f"Bearer {KEY}"}), (keyless, {}),
                                     (keyless, {"Authorization": f"Bearer {KEY}"}), (none, AS_ADMIN)):
                    async with http.post(f"{url}/reset_prefix_cache", headers=headers) as r:
                        assert r.status == 403, (url, headers)
                        assert (await r.json())["error"]["code"] in {"admin_key_required", "admin_disabled"}
                assert _held(cluster) == held and sum(held.values()) > 0  # nothing was dropped
                async with http.post(f"{key}/reset_prefix_cache", headers=AS_ADMIN) as r:
                    assert r.status == 200 and (await r.json())["dropped_blocks"] == sum(held.values())
                async with http.post(f"{keyless}/flush_cache", headers=AS_ADMIN) as r:
                    assert r.status == 200
                # The admin key is scoped: it opens no API path.
                async with http.post(f"{key}/v1/completions", json=BODY, headers=AS_ADMIN) as r:
                    assert r.status == 401
        finally:
            for runner, _ in servers.values():
                await runner.cleanup()


async def test_resets_are_paced_and_a_refused_one_changes_nothing() -> None:
    now = [100.0]
    async with local_cluster(1) as cluster:
        runner, url = await _serve_app(create_app(cluster.router, stats_interval_s=None, clock=lambda: now[0],
                                                  admin=AdminConfig(ADMIN, reset_interval_s=10.0)))
        try:
            async with aiohttp.ClientSession() as http:
                async with http.post(f"{url}/reset_prefix_cache", json={"timeout": -1}, headers=AS_ADMIN) as r:
                    assert r.status == 400  # bad input does not use up the reset
                async with http.post(f"{url}/reset_prefix_cache", headers=AS_ADMIN) as r:
                    assert r.status == 200
                await _complete_with(http, url)
                held = _held(cluster)
                now[0] += 9.5
                async with http.post(f"{url}/reset_prefix_cache", headers=AS_ADMIN) as r:
                    assert r.status == 429 and r.headers["Retry-After"] == "1"
                    assert (await r.json())["error"]["code"] == "rate_limit_exceeded"
                assert _held(cluster) == held and sum(held.values()) > 0
                now[0] += 0.5
                async with http.post(f"{url}/reset_prefix_cache", headers=AS_ADMIN) as r:
                    assert r.status == 200
                assert sum(_held(cluster).values()) == 0
        finally:
            await runner.cleanup()


async def _complete_with(http: aiohttp.ClientSession, url: str) -> None:
    async with http.post(f"{url}/v1/completions", json=BODY, headers={"Authorization": f"Bearer {KEY}"}) as r:
        assert r.status == 200


@pytest.mark.parametrize("eviction", sorted(EVICTION_ORDERS))
def test_engine_reset_drops_both_tiers_and_emits_the_removals(eviction: str) -> None:
    memory = MemoryConfig(num_gpu_blocks=32, num_host_blocks=32, pool=PoolConfig(eviction=eviction))
    engine = Engine(SOURCE.load(), EngineConfig(block_size=BS, model_id=SOURCE.identity(), memory=memory))
    prompts = [tuple(range(3 + i, 3 + i + 6 * BS)) for i in range(3)]
    engine.generate([Request(RequestId(f"r{i}"), p, SamplingParams(max_tokens=1)) for i, p in enumerate(prompts)])
    mem = engine.memory
    mem.evict(Tier.GPU, 2)  # two gpu blocks demoted: the host holds some too
    held = {t.value: mem.block_counts(t).cached for t in (Tier.GPU, Tier.HOST)}
    assert held["gpu"] > 0 and held["host"] == 2
    cached = {h for s in mem.snapshot() for h in s.hashes}
    mem.take_events()
    assert mem.reset_prefix_cache() == held
    assert mem.snapshot() == () and [mem.block_counts(t).cached for t in (Tier.GPU, Tier.HOST)] == [0, 0]
    removed = {h for e in mem.take_events() if isinstance(e, BlockRemoved) for h in e.hashes}
    assert cached <= removed
    engine.check_invariants()
    assert mem.reset_prefix_cache() == {"gpu": 0, "host": 0}
