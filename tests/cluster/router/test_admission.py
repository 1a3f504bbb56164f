"""Admission control: a bounded number of requests run and wait; past that they are refused at once
with HTTP 429 and Retry-After, counted, and nothing of theirs reaches an agent (issue 15)."""

import asyncio
import dataclasses
from collections.abc import AsyncIterator

import aiohttp
import pytest

from radixmesh.cluster.api.app import start_http
from radixmesh.cluster.fleet.agent_client import LocalAgentClient, StaticAgentDirectory
from radixmesh.cluster.router.admission import Admission, AdmissionLimits, Overloaded
from radixmesh.cluster.router.router import Router
from radixmesh.node_agent.agent import NodeAgent
from radixmesh.proto.serve.plan import ServePlan, TokenDelta
from radixmesh.proto.serve.sampling import SamplingParams
from tests.support.poll import until
from tests.support.router_cluster import MODEL_NAME, Cluster, agent_config, local_cluster, router_config

pytestmark = pytest.mark.anyio


async def test_slots_run_then_wait_in_order_then_refuse() -> None:
    admission = Admission(AdmissionLimits(max_running_per_node=2, max_waiting=2, max_wait_s=30), lambda: 1)
    order: list[str] = []
    entered = {name: asyncio.Event() for name in "abcd"}
    release = {name: asyncio.Event() for name in "abcd"}

    async def request(name: str) -> None:
        async with admission.slot():
            order.append(name)
            entered[name].set()
            await release[name].wait()

    tasks = {name: asyncio.ensure_future(request(name)) for name in "abcd"}
    await entered["a"].wait()
    await entered["b"].wait()
    # c and d take their places in line on their next loop turns
    await until(lambda: admission.waiting >= 2, "c and d to wait in line", pause_s=0)
    assert (order, admission.running, admission.waiting) == (["a", "b"], 2, 2)
    with pytest.raises(Overloaded) as refused:
        async with admission.slot():
            pass
    assert refused.value.retry_after_s == 1.0 and admission.waiting == 2
    tasks["d"].cancel()  # a waiter that gives up leaves the line
    await asyncio.gather(tasks["d"], return_exceptions=True)
    assert admission.waiting == 1
    release["b"].set()
    await entered["c"].wait()  # b's slot went to c, the first in line
    assert order == ["a", "b", "c"] and (admission.running, admission.waiting) == (2, 0)
    for name in "ac":
        release[name].set()
    await asyncio.gather(tasks["a"], tasks["b"], tasks["c"])
    assert (admission.running, admission.waiting) == (0, 0)


async def test_a_waiter_past_max_wait_is_refused() -> None:
    admission = Admission(AdmissionLimits(max_running_per_node=1, max_waiting=1, max_wait_s=0.05), lambda: 1)
    async with admission.slot():
        with pytest.raises(Overloaded, match="no slot within"):
            async with admission.slot():
                pass
        assert admission.waiting == 0
    assert admission.running == 0


def test_limits_are_validated() -> None:
    for bad in ({"max_running_per_node": 0}, {"max_waiting": -1}, {"max_wait_s": float("nan")}):
        with pytest.raises(ValueError):
            AdmissionLimits(**bad)  # type: ignore[arg-type]


@pytest.fixture
async def full() -> AsyncIterator[tuple[Cluster, str]]:
    limits = AdmissionLimits(max_running_per_node=1, max_waiting=0)
    async with local_cluster(1, admission=limits) as cluster:
        runner, port = await start_http(cluster.router, "127.0.0.1", 0)
        try:
            yield cluster, f"http://127.0.0.1:{port}"
        finally:
            await runner.cleanup()


async def test_past_the_limit_http_answers_429_with_retry_after(full: tuple[Cluster, str]) -> None:
    cluster, url = full
    body = {"model": MODEL_NAME, "prompt": "hold the only slot", "max_tokens": 400, "ignore_eos": True, "stream": True}
    async with aiohttp.ClientSession() as session:
        holder = await session.post(f"{url}/v1/completions", json=body)
        await holder.content.readuntil(b"\n\n")  # streaming: it holds the one running slot
        async with session.post(f"{url}/v1/completions", json={**body, "stream": False}) as refused:
            assert refused.status == 429 and refused.headers["Retry-After"] == "1"
            error = (await refused.json())["error"]
            assert (error["code"], error["type"]) == ("rate_limit_exceeded", "requests")
        async with session.get(f"{url}/metrics") as scrape:
            text = await scrape.text()
        assert f'radixmesh_router_requests_running{{model_name="{MODEL_NAME}"}} 1.0' in text
        assert f'radixmesh_router_requests_total{{model_name="{MODEL_NAME}",status="refused"}} 1.0' in text
        holder.close()  # its handler is cancelled and gives the slot back
        await until(lambda: not cluster.router.admission.running, "the closed stream to give its slot back")
        async with session.post(f"{url}/v1/completions", json={**body, "stream": False, "max_tokens": 2}) as after:
            assert after.status == 200
    assert cluster.router.metrics.status_counts["refused"] == 1
    assert sum(cluster.router.metrics.routed.values()) == 2  # the holder and the last one: never the refused one


async def test_agents_bound_their_requests_and_a_fully_busy_cluster_is_overloaded() -> None:
    agents = [NodeAgent(dataclasses.replace(agent_config(n), max_requests=1)) for n in ("a", "b")]
    for a in agents:
        await a.start()
    try:
        router = Router(router_config(agents[0].layout.fingerprint()),
                        StaticAgentDirectory([LocalAgentClient(a) for a in agents]), None)
        sampling = SamplingParams(max_tokens=300, ignore_eos=True)
        holders = [router.generate(ServePlan(f"hold-{i}", (5, 6, 7, 8, 9), sampling)) for i in range(2)]
        for h in holders:  # each holds one agent's only slot while it streams
            assert isinstance(await anext(h), TokenDelta)
        assert sorted(a.runner.active_requests for a in agents) == [1, 1]
        with pytest.raises(Overloaded, match="busy"):
            await router.complete(ServePlan("third", (5, 6, 7), SamplingParams(max_tokens=2)))
        assert router.metrics.status_counts.get("refused") == 1 and not router.metrics.failed_attempts
        for h in holders:
            await h.aclose()
        assert [a.runner.active_requests for a in agents] == [0, 0]
        done = await router.complete(ServePlan("after", (5, 6, 7), SamplingParams(max_tokens=2)))
        assert len(done.result.output_token_ids) == 2
        with pytest.raises(ValueError, match="max_requests"):
            dataclasses.replace(agent_config("c"), max_requests=0)
    finally:
        for a in agents:
            await a.stop()
