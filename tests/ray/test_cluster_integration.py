"""The product, end to end: `launcher.up` on a local Ray cluster (3 agents pinned by custom
resources, node IP 127.0.0.1), the metadata service on real Redis, the router's HTTP API driven by
the official `openai` client.

Prefixes are cached on one agent, then requests are forced onto another with a pull plan: the
blocks arrive over UCX, and every output equals one cache-less engine's output. The router's
/stats totals equal the sum of the per-request usage the client received.

The tests share one deployment (a second `up` of 3 agents took ~13 s); each agent's /metrics is read
once it is up, before any test sends it a request.
"""

import json
import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

import aiohttp
import openai
import pytest
import ray

from radixmesh.cluster.fleet.agent_client import RayAgentClient
from radixmesh.cluster.launch import launcher
from radixmesh.cluster.launch.config import LauncherConfig
from radixmesh.cluster.observability.file_sd import TARGETS_FILE, TOKEN_FILE
from radixmesh.common.metadata.auth import CallerCredentials
from radixmesh.common.metadata.client import MetadataClient
from radixmesh.common.metrics.scrape import metrics_token
from radixmesh.common.text.tokenizer import ByteTokenizer
from radixmesh.proto.block_hash import hash_blocks
from radixmesh.proto.ids import NodeId
from radixmesh.proto.metadata.messages import MatchQuery
from radixmesh.proto.serve.plan import PullPlan, ServePlan, ServeResult
from radixmesh.proto.serve.sampling import SamplingParams
from tests.support.local_deployment import deployed, module_ray
from tests.support.router_cluster import SOURCE, reference
from tests.support.servers import running_redis

pytestmark = [pytest.mark.ray, pytest.mark.anyio, pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(300)]
TOK = ByteTokenizer()
BS = 4
SYSTEMS = [f"System {i}: you are assistant {i} of a cluster; answer briefly and truthfully." for i in range(3)]
CONFIG = LauncherConfig(local_nodes=3, model=SOURCE, block_size=BS, gpu_blocks=256,
                        heartbeat_interval_s=0.2, publish_interval_s=0.01, model_name="tiny-test",
                        log_level="ERROR")


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    yield from module_ray(CONFIG)


# Module scope (conftest's is per test): the deployment the tests share is module-scoped.
@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


class Shared(NamedTuple):
    """The module's deployment, where it lists its Prometheus targets, and what they served at start."""

    deployment: launcher.Deployment
    prometheus_dir: Path
    fresh_metrics: dict[str, tuple[int, str]]
    """Each agent target in the Prometheus file (host:port): its /metrics' status and text once up."""


@pytest.fixture(scope="module")
async def shared(local_ray: None, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Shared]:
    # prefix_affinity: every repeat goes back to its prompt's holder, so what it reuses is known. Under
    # cost, a holder whose measured step floor read slower than a peer's (a loaded box) may lose a
    # repeat to a peer holding only the shared system prompt: right by its prices, not what a test
    # counts.
    prometheus_dir = tmp_path_factory.mktemp("prometheus")
    with running_redis() as redis_url:
        config = replace(CONFIG, state=redis_url, policy="prefix_affinity", prometheus_dir=prometheus_dir)
        async with deployed(config) as d:
            fresh = {}
            async with aiohttp.ClientSession() as http:
                for target in json.loads((prometheus_dir / TARGETS_FILE).read_text())[1:]:
                    [address] = target["targets"]
                    async with http.get(f"http://{address}/metrics") as r:  # loopback: no token needed
                        fresh[address] = (r.status, await r.text())
            yield Shared(d, prometheus_dir, fresh)


async def serve_forced(node: NodeId, plan: ServePlan) -> ServeResult:
    """Send `plan` straight to `node`'s agent actor, as the router would."""
    async for item in RayAgentClient(node, launcher.agent_handle(node)).serve(plan):
        if isinstance(item, ServeResult):
            return item
    raise AssertionError("no result")


async def test_cached_on_one_agent_pulled_by_another_outputs_exact(shared: Shared) -> None:
    d = shared.deployment
    assert d.nodes == ("node-0", "node-1", "node-2")
    sampling = SamplingParams(max_tokens=6)
    prompts = [f"{s} User {u} asks: what is a prefix cache?" for s in SYSTEMS for u in range(2)]
    usages = []
    async with openai.AsyncOpenAI(base_url=f"{d.router_url}/v1", api_key="unused", max_retries=0) as client:
        # One request at a time: the agents then run batch shape 1, like the reference engine.
        for text in prompts + prompts:
            out = await client.completions.create(model="tiny-test", prompt=text, max_tokens=6, temperature=0)
            assert out.choices[0].text == TOK.decode(list(reference(TOK.encode(text), sampling)))
            assert out.usage is not None and out.usage.prompt_tokens_details is not None
            usages.append((out.usage.prompt_tokens, out.usage.prompt_tokens_details.cached_tokens or 0))
    # The repeat of every prompt found its whole prefix but the block holding the last token.
    assert [cached for _, cached in usages[len(prompts):]] == [(len(p) - 1) // BS * BS for p in prompts]

    async with aiohttp.ClientSession() as http, http.get(f"{d.router_url}/stats") as r:
        stats = (await r.json())["router"]
    assert stats["requests"] == len(usages)
    assert stats["prompt_tokens"] == sum(total for total, _ in usages)
    assert stats["prompt_tokens"] - stats["computed"] == sum(cached for _, cached in usages)
    assert stats["local_gpu"] + stats["remote"] + stats["local_host"] == stats["prompt_tokens"] - stats["computed"]

    # The index knows a holder of every system prompt's full blocks.
    async with MetadataClient(d.metadata_address, credentials=CallerCredentials.cluster(CONFIG.secret),
                              timeout_s=5.0) as meta:
        layout = (await launcher.agent_handle(NodeId("node-0")).node_info.remote()).layout
        for system in SYSTEMS:
            hashes = hash_blocks(TOK.encode(system), BS, key=CONFIG.secret.hash_key())  # the deployment's key
            [match] = await meta.match([MatchQuery(layout, tuple(hashes))])
            assert max(m.gpu_blocks for m in match.nodes) == len(hashes)

    # A prefix no node has seen, cached on an owner by a forced serve, then forced onto another
    # node with a pull plan: it arrives over UCX. (Prefixes the router placed cannot serve here:
    # bounded load may have cached one on every node.)
    for i, owner in enumerate(d.nodes):
        target = d.nodes[(i + 1) % len(d.nodes)]
        system = f"Forced system {i}: you are the pulled assistant {i}; answer in one word."
        first = tuple(TOK.encode(f"{system} Which node computed this?"))
        done = await serve_forced(owner, ServePlan(f"owner-{i}", first, sampling))
        assert done.node == owner and done.stats.tokens.remote == 0
        blocks = len(TOK.encode(system)) // BS  # full blocks of the shared system part
        address = (await launcher.agent_handle(owner).node_info.remote()).transfer_address
        tokens = tuple(TOK.encode(f"{system} A new user {i} asks something else entirely."))
        plan = ServePlan(f"forced-{i}", tokens, sampling, pull=PullPlan(owner, address, 0, blocks))
        result = await serve_forced(target, plan)
        assert result.node == target and not result.stats.pull_failed
        # The target may hold a first block itself (every forced prompt starts "Forced system ").
        assert result.stats.tokens.remote > 0
        assert result.stats.tokens.local_gpu + result.stats.tokens.remote == blocks * BS
        assert result.stats.pull_bytes > 0
        assert result.output_token_ids == reference(tokens, sampling)
        text = await launcher.agent_handle(target).prometheus_text.remote()
        assert f'peer="{owner}"' in text
    for node in d.nodes:
        await launcher.agent_handle(node).check_invariants.remote()



@ray.remote(num_cpus=0)
def _root_log_level() -> int:
    return logging.getLogger().getEffectiveLevel()


async def test_actors_log_at_the_deployments_level(local_ray: None) -> None:
    # init_local_ray set the job's runtime_env from CONFIG.log_level: every worker starts with it.
    assert await _root_log_level.remote() == logging.ERROR  # Ray's own default is WARNING


async def test_each_agent_actor_serves_its_own_metrics_listed_for_prometheus(shared: Shared) -> None:
    d, folder = shared.deployment, shared.prometheus_dir
    router, *agents = json.loads((folder / TARGETS_FILE).read_text())
    assert router["labels"]["role"] == "router" and router["targets"] == [d.router_url.split("//")[1]]
    assert [a["labels"]["node"] for a in agents] == list(d.nodes)
    assert (folder / TOKEN_FILE).read_text() == metrics_token(CONFIG.secret)
    for a in agents:
        [address] = a["targets"]
        status, text = shared.fresh_metrics[address]  # read at start: no request served yet
        assert status == 200
        assert f'radixmesh_agent_requests_total{{model_name="tiny-test",node="{a["labels"]["node"]}"}} 0.0' in text
    async with aiohttp.ClientSession() as http, http.get(f"{d.router_url}/metrics", params={"scope": "router"}) as r:
        assert "radixmesh_agent_requests_total" not in await r.text()
