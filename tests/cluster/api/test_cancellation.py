"""Cancellation end to end: a client that goes away, streaming or not, ends its request on the agent
within a step or so and frees every block it held (issue 15)."""

import asyncio
import json
import threading
from collections.abc import AsyncIterator

import aiohttp
import pytest

from radixmesh.cluster.api.app import start_http
from radixmesh.node_agent.agent import NodeAgent
from radixmesh.node_agent.engine.request import RequestId
from radixmesh.proto.events import Tier
from radixmesh.proto.serve.plan import PullPlan, ServePlan
from radixmesh.proto.serve.sampling import SamplingParams
from tests.support.agents import collect
from tests.support.poll import until
from tests.support.router_cluster import BS, MODEL_NAME, Cluster, agent_config, local_cluster

pytestmark = pytest.mark.anyio
MAX_TOKENS = 900  # far more than the test lets run: a request that was not cancelled would finish it


@pytest.fixture
async def served() -> AsyncIterator[tuple[Cluster, str]]:
    async with local_cluster(2) as cluster:
        runner, port = await start_http(cluster.router, "127.0.0.1", 0)
        try:
            yield cluster, f"http://127.0.0.1:{port}"
        finally:
            await runner.cleanup()


def running(cluster: Cluster) -> bool:
    return any(a.engine.has_work for a in cluster.agents)


async def all_free(cluster: Cluster) -> None:
    await until(lambda: not running(cluster), "the agents to drop the request")
    for a in cluster.agents:
        await a.check_invariants()
        assert a.memory.block_counts(Tier.GPU).in_use == 0
        assert a.engine.counters.generated_tokens < MAX_TOKENS  # it stopped early: it was cancelled
    await until(lambda: cluster.router.metrics.status_counts.get("cancelled") == 1, "the router to count it")


def body(stream: bool) -> dict[str, object]:
    return {"model": MODEL_NAME, "prompt": "Tell me everything, at length.", "max_tokens": MAX_TOKENS,
            "ignore_eos": True, "stream": stream}


async def test_a_non_streaming_client_that_disconnects_cancels_its_request(served: tuple[Cluster, str]) -> None:
    cluster, url = served
    async with aiohttp.ClientSession() as session:
        post = asyncio.ensure_future(session.post(f"{url}/v1/completions", json=body(stream=False)))
        await until(lambda: running(cluster), "the request to reach an agent")
        post.cancel()  # closes the connection before any answer
        with pytest.raises(asyncio.CancelledError):
            await post
    await all_free(cluster)


async def test_a_stream_closed_midway_cancels_its_request(served: tuple[Cluster, str]) -> None:
    cluster, url = served
    async with aiohttp.ClientSession() as session:
        resp = await session.post(f"{url}/v1/completions", json=body(stream=True))
        first = await resp.content.readuntil(b"\n\n")
        assert json.loads(first.removeprefix(b"data: "))["object"] == "text_completion"
        resp.close()  # drops the connection mid-stream
    await all_free(cluster)


async def test_a_request_cancelled_during_its_pull_frees_both_nodes() -> None:
    owner, puller = (NodeAgent(agent_config(n, transfer="ucx")) for n in ("owner", "puller"))
    await owner.start()
    await puller.start()
    try:
        tokens = tuple((7 * i) % 250 for i in range(48))
        await collect(owner.serve(ServePlan("warm", tokens, SamplingParams(max_tokens=2, ignore_eos=True))))
        full = len(tokens) // BS
        # The owner's engine thread is held: it cannot pin the blocks, so the pull hangs mid-way.
        held = threading.Event()
        hold = asyncio.ensure_future(owner.runner.call(held.wait))
        plan = ServePlan("pulling", tokens, SamplingParams(max_tokens=50, ignore_eos=True),
                         pull=PullPlan(owner.node, owner.transfer_address, 0, full))
        serving = asyncio.ensure_future(collect(puller.serve(plan)))
        # The hold, then the pull's pin: the puller's request is waiting on the owner.
        await until(lambda: owner.runner.pending_calls >= 2, "the pull to reach the owner")
        serving.cancel()
        with pytest.raises(asyncio.CancelledError):
            await serving
        held.set()
        await hold
        for agent in (owner, puller):
            # Nothing queued on the engine thread as well: the owner's pin for the abandoned pull runs
            # after the hold, and is released only once its send fails, so no blocks in use before
            # that job ran says nothing.
            await until(lambda a=agent: a.runner.pending_calls == 0
                        and a.memory.block_counts(Tier.GPU).in_use == 0, f"{agent.node} to free its blocks")
            await agent.check_invariants()
        assert not puller.runner.is_active(RequestId("pulling")) and not puller.engine.has_work
    finally:
        await puller.stop()
        await owner.stop()
