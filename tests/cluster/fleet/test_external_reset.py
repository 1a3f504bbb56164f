"""The prefix-cache reset reaches external engines (issue 30): EngineAgentClient forwards it to vLLM's
`POST /reset_prefix_cache` or SGLang's `POST /flush_cache`, reports no block counts (the engine gives
none), maps a refusal to AgentBusy and a missing endpoint to AgentUnavailable; the engine's
AllBlocksCleared then empties what we index of it. Fake engines run in their own processes."""

import contextlib
import dataclasses
import random
from collections.abc import AsyncIterator

import aiohttp
import pytest

from radixmesh.cluster.fleet.agent_client import AgentUnavailable, StaticAgentDirectory
from radixmesh.cluster.fleet.engine_client import EngineAgentClient
from radixmesh.cluster.fleet.external_fleet import ExternalFleet
from radixmesh.cluster.router.config import RouterConfig
from radixmesh.cluster.router.router import Router
from radixmesh.proto.ids import NodeId
from radixmesh.proto.serve.limits import AgentBusy, PromptLimits
from radixmesh.proto.serve.plan import ServePlan, ServeResult
from radixmesh.proto.serve.sampling import SamplingParams
from tests.cluster.fleet.test_external_engine import (
    BS,
    LAYOUT,
    SYSTEM,
    FakeEngineProcess,
    engine_config,
    fake_engine,
    wait_subscribed,
)
from tests.support.poll import until
from tests.support.servers import free_port

pytestmark = [pytest.mark.anyio, pytest.mark.integration]


@contextlib.asynccontextmanager
async def engines(**resets: str) -> AsyncIterator[tuple[ExternalFleet, dict[str, FakeEngineProcess]]]:
    """One fake engine per name, with that `--reset` flavour, followed without a metadata service."""
    async with contextlib.AsyncExitStack() as stack:
        fakes = {name: await stack.enter_async_context(fake_engine("--reset", flavour))
                 for name, flavour in resets.items()}
        fleet = ExternalFleet([engine_config(name, fake) for name, fake in fakes.items()], None)
        await fleet.start()
        stack.push_async_callback(fleet.stop)
        async with aiohttp.ClientSession() as http:
            for fake in fakes.values():
                await wait_subscribed(http, fake)
        yield fleet, fakes


async def serve(client: EngineAgentClient, prompt: list[int]) -> int:
    """Serve `prompt` on the engine; the prompt tokens it found cached."""
    plan = ServePlan(f"r-{random.random()}", tuple(prompt), SamplingParams(max_tokens=1, seed=0))
    items = [item async for item in client.serve(plan)]
    assert isinstance(items[-1], ServeResult)
    return items[-1].stats.tokens.local_gpu


async def cached_system(fleet: ExternalFleet, name: str) -> EngineAgentClient:
    """The engine's client, once the engine caches SYSTEM's 10 blocks and we index them."""
    client = fleet.clients[NodeId(name)]
    assert await serve(client, [*SYSTEM, 9]) == 0
    blocks = fleet.engines[NodeId(name)].node.blocks
    await until(lambda: len(blocks) == 10, f"{name}'s 10 blocks indexed")
    return client


@pytest.mark.parametrize("flavour", ["vllm", "sglang"])
async def test_a_reset_empties_the_engine_and_what_we_index_of_it(flavour: str) -> None:
    async with engines(e=flavour) as (fleet, _):
        client = await cached_system(fleet, "e")
        assert await client.reset_prefix_cache() == {}  # no counts: the engine reports none
        blocks = fleet.engines[NodeId("e")].node.blocks
        await until(lambda: len(blocks) == 0, "AllBlocksCleared empties the engine's block map")
        assert await serve(client, [*SYSTEM, 10]) == 0
        blocks.check_invariants()


async def test_an_engine_that_refuses_the_reset_is_busy_and_keeps_its_cache() -> None:
    async with engines(e="sglang") as (fleet, fakes):
        client = await cached_system(fleet, "e")
        async with aiohttp.ClientSession() as http, http.post(f"{fakes['e'].url}/control/waiting", json={"n": 1}) as r:
            assert r.status == 200
        with pytest.raises(AgentBusy, match=r"engine e refused the reset \(HTTP 400"):
            await client.reset_prefix_cache()
        assert await serve(client, [*SYSTEM, 10]) == 40


async def test_an_engine_without_a_reset_endpoint_or_gone_is_unavailable() -> None:
    async with engines(e="none") as (fleet, _):
        client = await cached_system(fleet, "e")
        with pytest.raises(AgentUnavailable, match=r"serves no cache reset.*VLLM_SERVER_DEV_MODE=1"):
            await client.reset_prefix_cache()
        assert await serve(client, [*SYSTEM, 10]) == 40
        gone = EngineAgentClient(dataclasses.replace(client.config, openai_url=f"http://127.0.0.1:{free_port()}"))
        try:
            with pytest.raises(AgentUnavailable, match="engine e reset: ClientConnectorError"):
                await gone.reset_prefix_cache()
        finally:
            await gone.close()


async def test_the_router_resets_external_engines_and_reports_those_it_cannot() -> None:
    async with engines(v="vllm", s="sglang", n="none") as (fleet, _):
        for name in ("v", "s"):
            await cached_system(fleet, name)
        config = RouterConfig(LAYOUT, block_size=BS, policy="cost_no_pull", model_name="fake-model",
                              limits=PromptLimits(vocab_size=256, max_context_tokens=1024))
        router = Router(config, StaticAgentDirectory(fleet.clients.values()), None, rng=random.Random(0))
        reset = await router.reset_prefix_cache()
        assert reset.dropped == {"v": {}, "s": {}} and reset.busy == {}
        assert list(reset.failed) == ["n"] and "serves no cache reset" in reset.failed[NodeId("n")]
        for name in ("v", "s"):
            assert await serve(fleet.clients[NodeId(name)], [*SYSTEM, 10]) == 0
