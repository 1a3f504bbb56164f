"""`up --local 2 --prefill 1 --decode 1` for real (issue 37): launcher.up on a local Ray, the agents'
roles reach the router through their registration (the reconciler's directory), every completion
is prefilled on node-0 and decoded on node-1 from the KV it pulled over UCX, with the tokens of one
cache-less engine; the router's /metrics and /stats count the hand-offs; with a prefill actor killed,
requests are retried on the other one. No block leaks on either side."""

import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace

import aiohttp
import openai
import pytest
import ray
from prometheus_client.parser import text_string_to_metric_families

from radixmesh.cluster.launch import launcher
from radixmesh.cluster.launch.config import LauncherConfig
from radixmesh.common.text.tokenizer import ByteTokenizer
from radixmesh.proto.ids import NodeId
from radixmesh.proto.serve.sampling import SamplingParams
from tests.support.router_cluster import SOURCE, reference

pytestmark = [pytest.mark.ray, pytest.mark.anyio, pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(300)]
TOK = ByteTokenizer()
BS = 4
CONFIG = LauncherConfig(local_nodes=3, prefill_nodes=1, decode_nodes=2, model=SOURCE, block_size=BS,
                        gpu_blocks=256, heartbeat_interval_s=0.2, publish_interval_s=0.01, model_name="tiny-test",
                        log_level="ERROR")


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    launcher.init_local_ray(CONFIG)
    yield
    ray.shutdown()


@contextlib.asynccontextmanager
async def deployed(config: LauncherConfig) -> AsyncIterator[launcher.Deployment]:
    deployment = await launcher.up(config)
    try:
        yield deployment
    finally:
        assert await launcher.down()


async def test_a_1p1d_deployment_hands_every_prompt_to_its_decode_agent(local_ray: None) -> None:
    async with deployed(replace(CONFIG, local_nodes=2, decode_nodes=1)) as d:
        assert [info.role for info in await launcher.router_handle().joined.remote()] in (
            ["prefill", "decode"], ["decode", "prefill"])
        sampling = SamplingParams(max_tokens=6)
        prompts = [f"System: you are a split cluster's assistant. User {u} asks: what is a hand-off?" for u in range(3)]
        async with openai.AsyncOpenAI(base_url=f"{d.router_url}/v1", api_key="unused", max_retries=0) as client:
            for text in prompts:
                out = await client.completions.create(model="tiny-test", prompt=text, max_tokens=6, temperature=0)
                assert out.choices[0].text == TOK.decode(list(reference(TOK.encode(text), sampling)))
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{d.router_url}/metrics", params={"scope": "router"}) as r:
                families = {f.name: f for f in text_string_to_metric_families(await r.text())}
            async with http.get(f"{d.router_url}/stats") as r:
                stats = (await r.json())["router"]
        handoffs = {s.labels["outcome"]: s.value for s in families["radixmesh_handoffs"].samples
                    if s.name.endswith("_total")}
        assert handoffs == {"pulled": len(prompts)}
        roles = {s.labels["role"]: s.value for s in families["radixmesh_role_decisions"].samples
                 if s.name.endswith("_total")}
        assert roles == {"prefill": len(prompts), "decode": len(prompts)}
        assert stats["handoffs"] == {"pulled": len(prompts)} and stats["handoff_bytes"] > 0
        assert stats["nodes"]["node-1"]["routed"] == len(prompts) and stats["nodes"]["node-0"]["routed"] == len(prompts)
        for node in d.nodes:
            await launcher.agent_handle(node).check_invariants.remote()


async def test_a_killed_prefill_agent_is_replaced_by_the_other_with_the_same_tokens(local_ray: None) -> None:
    config = replace(CONFIG, prefill_nodes=2, decode_nodes=1, policy="round_robin")
    async with deployed(config) as d:
        ray.kill(launcher.agent_handle(NodeId("node-0")), no_restart=True)
        sampling = SamplingParams(max_tokens=6)
        async with openai.AsyncOpenAI(base_url=f"{d.router_url}/v1", api_key="unused", max_retries=0) as client:
            for u in range(3):
                text = f"System: a prefill agent died. User {u} asks: who prefilled this?"
                out = await client.completions.create(model="tiny-test", prompt=text, max_tokens=6, temperature=0)
                assert out.choices[0].text == TOK.decode(list(reference(TOK.encode(text), sampling)))
        async with aiohttp.ClientSession() as http, http.get(f"{d.router_url}/stats") as r:
            stats = (await r.json())["router"]
        assert stats["requests_by_status"] == {"ok": 3} and stats["handoffs"] == {"pulled": 3}
        assert stats["nodes"]["node-0"]["failed_attempts"] >= 1 and stats["nodes"]["node-1"]["requests"] == 3
        for node in ("node-1", "node-2"):
            await launcher.agent_handle(NodeId(node)).check_invariants.remote()
