"""A modeled cluster end to end (issue 36's must-show): `launcher.up` with two agents running
`--engine modeled:cpu-smollm2` serves shared-prefix requests through the router, hitting and pulling
prefixes, and a second pass with caching off gives the same outputs token for token: caching off as
`radixmesh bench`'s `off` arm has it, each request its own `cache_salt`, on the same deployment (one
cluster start less; the engine with `enable_prefix_caching` off is tests/node_agent/model/test_modeled_engine.py's)."""

import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest
import ray
from click.testing import CliRunner

from radixmesh.cluster.cli.bench import deployment_engine
from radixmesh.cluster.cli.main import main
from radixmesh.cluster.launch import launcher
from radixmesh.cluster.launch.config import LauncherConfig
from radixmesh.cluster.sim.router_client import KEYLESS, router_stats
from radixmesh.node_agent import parse_engine, resolve_model
from tests.support.poll import until

pytestmark = [pytest.mark.ray, pytest.mark.anyio, pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(300)]
MODELED = parse_engine("modeled:cpu-smollm2", speedup=10.0)
assert MODELED is not None
CONFIG = LauncherConfig(local_nodes=2, model=resolve_model(MODELED.profile.model), modeled=MODELED,
                        gpu_blocks=512, heartbeat_interval_s=0.2, publish_interval_s=0.01, log_level="ERROR",
                        log_access=False)
SYSTEMS = [[(s * 37 + i * 11) % 250 for i in range(96)] for s in range(2)]
PROMPTS = [system + [(u * 13 + i) % 250 for i in range(1, 12 + u)] for system in SYSTEMS for u in range(3)]


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    launcher.init_local_ray(CONFIG)
    yield
    ray.shutdown()


@contextlib.asynccontextmanager
async def deployed() -> AsyncIterator[str]:
    """CONFIG's deployment on the module's Ray, once both agents are routed: its router's URL."""
    deployment = await launcher.up(CONFIG)
    try:
        await until(lambda: len(ray.get(launcher.router_handle().nodes.remote())) == 2, "both agents routed",
                    timeout_s=120)
        yield deployment.router_url
    finally:
        assert await launcher.down()


async def complete_all(url: str, salted: bool = False) -> list[list[Any]]:
    """Every prompt, one at a time, twice over; the text and usage of each. `salted`: each request with
    its own cache_salt, so none reuses another's prefix."""
    outs = []
    async with aiohttp.ClientSession() as http:
        for i, tokens in enumerate(PROMPTS + PROMPTS):
            body: dict[str, Any] = {"model": CONFIG.served_model_name, "prompt": tokens, "max_tokens": 6,
                                    "temperature": 0, "ignore_eos": True}
            if salted:
                body["cache_salt"] = f"off-{i}"
            async with http.post(f"{url}/v1/completions", json=body) as r:
                assert r.status == 200, await r.text()
                doc = await r.json()
            outs.append([doc["choices"][0]["text"], doc["usage"]])
    return outs


async def test_modeled_outputs_equal_a_second_run_with_caching_off(local_ray: None) -> None:
    async with deployed() as url:
        cached = await complete_all(url)
        stats = await router_stats(url)
        assert await deployment_engine(url, KEYLESS) == "modeled:cpu-smollm2"  # what `bench --url` labels it with
        uncached = await complete_all(url, salted=True)
    assert [text for text, _ in cached] == [text for text, _ in uncached]
    assert all(len(text) > 0 for text, _ in cached)
    hits = sum((u.get("prompt_tokens_details") or {}).get("cached_tokens", 0) for _, u in cached)
    assert hits > 0, stats  # the first run did reuse prefixes
    assert all(not (u.get("prompt_tokens_details") or {}).get("cached_tokens") for _, u in uncached)


@pytest.mark.parametrize(("args", "message"), [
    (["--engine", "modeled:a100"], "unknown profile 'a100'; valid:"),
    (["--engine", "mocked"], "unknown engine 'mocked'; valid: real, modeled, modeled:PROFILE"),
    (["--engine", "modeled:h100-llama3-8b", "--model", "random-tiny"],
     "models random-llama3-8b; leave out --model random-tiny"),
    (["--engine", "modeled", "--speedup", "0"], "--speedup"),
])
def test_bad_engine_options_are_usage_errors_before_ray_starts(args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, ["bench", "--local", "2", *args])
    assert result.exit_code == 2 and message in result.output, result.output  # 2: a usage error, before any Ray
