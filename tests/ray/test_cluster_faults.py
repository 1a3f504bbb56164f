"""Faults on a running deployment (local Ray, 3 agents, metadata service on real Redis, short leases).

- The metadata service stops: requests keep succeeding, routed by least_loaded; it restarts on the
  same Redis and port: prefix routing (cost) resumes and finds the prefixes cached before.
- An agent is killed while it streams: its requests are retried on other nodes and finish whole;
  the index drops the node once its lease ends; the hit rate recovers.

No sleeps: every wait polls a condition under a deadline.
"""

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import openai
import pytest
import ray

from radixmesh.cluster.launch import launcher
from radixmesh.cluster.launch.config import LauncherConfig
from radixmesh.common.metadata.auth import CallerCredentials
from radixmesh.common.metadata.client import MetadataClient
from radixmesh.common.secret import ClusterSecret
from radixmesh.common.text.tokenizer import ByteTokenizer
from radixmesh.proto.ids import NodeId
from radixmesh.proto.serve.sampling import SamplingParams
from tests.support.poll import until
from tests.support.router_cluster import SOURCE, reference
from tests.support.servers import running_redis

pytestmark = [pytest.mark.ray, pytest.mark.anyio, pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(300)]
TOK = ByteTokenizer()
SECRET = ClusterSecret.generate()
BS, LONG = 4, 160
SYSTEM = "System: you are the assistant of a radixmesh cluster under fault injection; be brief."


# Module scope (conftest's is per test): the deployment fixture these tests share is module-scoped.
@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def redis_module() -> Iterator[str]:
    """A redis-server shared by this module's tests (conftest's redis_url is per test, but the
    deployment these tests share outlives one test)."""
    with running_redis() as url:
        yield url


@pytest.fixture(scope="module")
async def deployment(redis_module: str) -> AsyncIterator[launcher.Deployment]:
    config = LauncherConfig(local_nodes=3, model=SOURCE, block_size=BS, gpu_blocks=512, state=redis_module,
                            secret=SECRET, lease_ttl_s=1.5, heartbeat_interval_s=0.2, publish_interval_s=0.01,
                            metadata_retry_s=0.1, model_name="tiny-test")
    launcher.init_local_ray(config)
    try:
        yield await launcher.up(config)
        assert await launcher.down()
    finally:
        ray.shutdown()


@pytest.fixture
async def client(deployment: launcher.Deployment) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=f"{deployment.router_url}/v1", api_key="-", max_retries=0) as c:
        yield c


async def stats(d: launcher.Deployment) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http, http.get(f"{d.router_url}/stats") as r:
        body: dict[str, Any] = await r.json()
        return body


async def cached(client: openai.AsyncOpenAI, prompt: str, max_tokens: int = 4) -> tuple[int, int]:
    """(cached, prompt) tokens of one greedy completion."""
    out = await client.completions.create(model="tiny-test", prompt=prompt, max_tokens=max_tokens, temperature=0)
    assert out.usage is not None and out.usage.prompt_tokens_details is not None
    return out.usage.prompt_tokens_details.cached_tokens or 0, out.usage.prompt_tokens


def family(n: int, tag: str) -> list[str]:
    return [f"{SYSTEM} [{tag}] user {i}: tell me something." for i in range(n)]


async def test_metadata_outage_degrades_to_least_loaded_then_prefix_routing_resumes(
        deployment: launcher.Deployment, client: openai.AsyncOpenAI) -> None:
    prompts = family(4, "outage")
    for p in prompts:
        await cached(client, p)
    metadata = launcher.metadata_handle()
    await metadata.stop.remote()
    for p in family(4, "during"):
        await cached(client, p)  # succeeds with the service gone
    during = await stats(deployment)
    assert during["router"]["active_policy"] == "least_loaded" and during["router"]["degraded"]
    assert during["metadata"] is None

    assert await metadata.start.remote() == deployment.metadata_address  # same Redis, same port

    async def resumed() -> bool:
        await cached(client, "probe: any prompt makes the router ask the metadata service again")
        return bool((await stats(deployment))["router"]["active_policy"] == "cost")

    await until(resumed, "prefix routing resumes", pause_s=0)
    after = await stats(deployment)
    assert after["metadata"]["state_store"].startswith("redis")
    # Routed by prefix again: each repeat reuses its prompt where it is cached, or, where bounded
    # load sends it on, at least the system prompt every request of this test shares, recomputing
    # its own tail (a few blocks the tiny model prefills about as fast as a pull's fixed cost).
    shared = len(os.path.commonprefix([TOK.encode(p) for p in [*prompts, *family(4, "during")]])) // BS * BS
    for p in prompts:
        hit, total = await cached(client, p)
        assert shared <= hit <= (total - 1) // BS * BS, (hit, total, shared)


async def test_killed_agent_requests_retried_index_drops_it_hit_rate_recovers(
        deployment: launcher.Deployment, client: openai.AsyncOpenAI) -> None:
    sampling = SamplingParams(max_tokens=LONG)
    # Prompts whose greedy continuation runs the full LONG tokens (no early EOS), so they are
    # still streaming when the agent dies; chosen by the cache-less reference engine.
    candidates = [f"Stream {i}: count slowly and never stop." for i in range(16)]
    long_prompts = [p for p in candidates if len(reference(TOK.encode(p), sampling)) == LONG][:6]
    assert len(long_prompts) == 6
    warm = family(6, "kill")
    for p in warm:
        await cached(client, p)
    before = [await cached(client, p) for p in warm]
    rate_before = sum(h for h, _ in before) / sum(t for _, t in before)

    started = [asyncio.Event() for _ in long_prompts]

    async def stream(i: int) -> int:
        out = await client.completions.create(model="tiny-test", prompt=long_prompts[i], max_tokens=LONG,
                                              temperature=0, stream=True, stream_options={"include_usage": True})
        produced = 0
        async for chunk in out:
            started[i].set()
            produced = chunk.usage.completion_tokens if chunk.usage is not None else produced
        return produced

    tasks = [asyncio.create_task(stream(i)) for i in range(len(long_prompts))]
    await asyncio.gather(*(e.wait() for e in started))
    inflight = (await stats(deployment))["router"]["nodes"]
    victim = NodeId(max(inflight, key=lambda n: inflight[n]["inflight"]))
    assert inflight[victim]["inflight"] >= 1
    ray.kill(launcher.agent_handle(victim), no_restart=True)
    # Every stream finishes whole: the victim's requests were retried elsewhere.
    assert await asyncio.gather(*tasks) == [LONG] * len(long_prompts)
    after_kill = (await stats(deployment))["router"]
    assert after_kill["retries"] >= 1 and after_kill["nodes"][victim]["failed_attempts"] >= 1

    async with MetadataClient(deployment.metadata_address, credentials=CallerCredentials.cluster(SECRET),
                              timeout_s=5.0) as meta:
        async def dropped() -> bool:
            return (await meta.stats()).live_nodes == 2

        await until(dropped, f"the index drops {victim} once its lease ends", pause_s=0)
    routed_to_victim = after_kill["nodes"][victim]["routed"]
    for p in warm:  # re-cache what lived on the victim
        await cached(client, p)
    again = [await cached(client, p) for p in warm]
    total = sum(t for _, t in again)
    rate_after = sum(h for h, _ in again) / total
    # Recovered: the survivors hold the family again. Bounded load may still send a repeat to the
    # less-worked survivor, which holds the family's shared system prompt but not that prompt's own
    # tail; the cost policy recomputes the tail there when that is cheaper than a pull (a few blocks
    # of the tiny model prefill in ~2 ms, under a pull's fixed cost), so at most the blocks past the
    # shared part may be computed instead of reused.
    shared = len(os.path.commonprefix([TOK.encode(p) for p in warm])) // BS * BS
    tails = sum(len(TOK.encode(p)) - shared for p in warm)
    assert rate_after >= rate_before - tails / total, (rate_before, rate_after, tails)
    assert (await stats(deployment))["router"]["nodes"][victim]["routed"] == routed_to_victim
