"""`up --local 2 --prefill 1 --decode 1` for real (issue 37): launcher.up on a local Ray, the agents'
roles reach the router through their registration (the reconciler's directory), every completion
is prefilled on node-0 and decoded on node-1 from the KV it pulled over UCX, with the tokens of one
cache-less engine; the router's /metrics and /stats count the hand-offs."""

import contextlib
from collections.abc import AsyncIterator, Iterator

import aiohttp
import openai
import pytest
import ray
from prometheus_client.parser import text_string_to_metric_families

from radixmesh.cluster.launch import launcher
from radixmesh.cluster.launch.config import LauncherConfig
from radixmesh.common.text.tokenizer import ByteTokenizer
from radixmesh.proto.serve.sampling import SamplingParams
from tests.support.router_cluster import SOURCE, reference

pytestmark = [pytest.mark.ray, pytest.mark.anyio, pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(300)]
TOK = ByteTokenizer()
BS = 4
CONFIG = LauncherConfig(local_nodes=2, prefill_nodes=1, decode_nodes=1, model=SOURCE, block_size=BS,
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
    async with deployed(CONFIG) as d:
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
