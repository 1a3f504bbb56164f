"""The front's credentials (issue 38, items 10, 11 and the admin key): each engine gets its own API key
(from the environment, never the command line or a log line) on every call, a refused key is the
operator's error and never the client's 400; the API refuses to serve beyond loopback keyless, and
the admin key is checked before anything starts. The engine is a real aiohttp server on 127.0.0.1
that demands its key."""

import json
import socket
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.typedefs import Handler
from click.testing import CliRunner

from radixmesh.cluster.api.app import start_http
from radixmesh.cluster.cli.front import parse_engine
from radixmesh.cluster.cli.main import main
from radixmesh.cluster.fleet.agent_client import AgentUnavailable
from radixmesh.cluster.fleet.engine_client import EngineAgentClient
from radixmesh.cluster.fleet.ingest.external_engine import ExternalEngineConfig, ExternalEngineNode
from radixmesh.cluster.fleet.ingest.subscriber import SubscriberConfig
from radixmesh.cluster.launch.config import LauncherConfig
from radixmesh.proto.ids import NodeId
from radixmesh.proto.serve.plan import ServePlan, ServeResult
from radixmesh.proto.serve.sampling import SamplingParams

pytestmark = [pytest.mark.anyio, pytest.mark.integration]
KEY = "engine-0-key"


class KeyedEngine:
    """vLLM's --api-key in miniature: every path answers 401 without `Bearer KEY`; `seen` records the
    Authorization header of each call by path."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    @web.middleware
    async def auth(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        given = request.headers.get("Authorization", "")
        self.seen.append((request.path, given))
        if given != f"Bearer {KEY}":
            return web.json_response({"error": {"message": "Unauthorized"}}, status=401)
        return await handler(request)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        chunk = {"choices": [{"token_ids": [7], "finish_reason": "length"}],
                 "usage": {"prompt_tokens_details": {"cached_tokens": 0}}}
        await response.write(f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode())
        return response

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(text="vllm:num_requests_waiting 3\nvllm:num_requests_running 1\n")

    async def reset(self, request: web.Request) -> web.Response:
        return web.Response(text="")


@pytest.fixture
async def engine() -> AsyncIterator[tuple[KeyedEngine, str]]:
    keyed = KeyedEngine()
    app = web.Application(middlewares=[keyed.auth])
    app.router.add_post("/v1/completions", keyed.completions)
    app.router.add_get("/metrics", keyed.metrics)
    app.router.add_post("/reset_prefix_cache", keyed.reset)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield keyed, f"http://127.0.0.1:{runner.addresses[0][1]}"
    await runner.cleanup()


def config(url: str, api_key: str) -> ExternalEngineConfig:
    return ExternalEngineConfig(NodeId("e0"), url, SubscriberConfig("tcp://127.0.0.1:1"), "external:m:bs4", "m",
                                block_size=4, api_key=api_key)


async def serve_once(client: EngineAgentClient) -> ServeResult:
    plan = ServePlan("r1", (1, 2, 3, 4), SamplingParams(max_tokens=1), "")
    items = [item async for item in client.serve(plan)]
    assert isinstance(items[-1], ServeResult)
    return items[-1]


async def test_every_call_to_an_engine_carries_its_key(engine: tuple[KeyedEngine, str]) -> None:
    keyed, url = engine
    cfg = config(url, KEY)
    assert KEY not in repr(cfg)  # configs are logged
    client, node = EngineAgentClient(cfg), ExternalEngineNode(cfg, publishing=False)
    try:
        assert (await serve_once(client)).output_token_ids == (7,)
        assert "vllm:num_requests_waiting" in await client.prometheus_text()
        assert await client.reset_prefix_cache() == {}
        assert (await node.refresh_metrics()).waiting == 3 and node.metrics_failures == 0
    finally:
        await client.close()
        await node.close()
    assert keyed.seen == [(path, f"Bearer {KEY}") for path in
                          ("/v1/completions", "/metrics", "/reset_prefix_cache", "/metrics")]


async def test_a_refused_key_is_the_operators_error_not_the_clients(engine: tuple[KeyedEngine, str]) -> None:
    _, url = engine
    client = EngineAgentClient(config(url, "wrong"))
    try:
        with pytest.raises(AgentUnavailable, match="refused the front's credential"):
            await serve_once(client)  # an InvalidRequest would reach the client as its own 400
        with pytest.raises(AgentUnavailable, match="refused the front's credential"):
            await client.reset_prefix_cache()
    finally:
        await client.close()


def parse(spec: str, environ: dict[str, str]) -> ExternalEngineConfig:
    return parse_engine(spec, model="m", block_size=16, layout="external:m:bs16", hash_key=b"k", capacity_blocks=0,
                        environ=environ)


def test_the_key_comes_from_the_variable_the_spec_names() -> None:
    spec = "name=e0,url=http://10.0.0.5:8000,events=tcp://10.0.0.5:5557,key-env=E0_KEY"
    assert parse(spec, {"E0_KEY": KEY}).api_key == KEY
    assert parse(spec.removesuffix(",key-env=E0_KEY"), {"E0_KEY": KEY}).api_key == ""
    with pytest.raises(ValueError, match="key-env=E0_KEY names an unset or empty variable"):
        parse(spec, {})


def test_the_front_refuses_an_unset_key_variable_before_starting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("E0_KEY", raising=False)
    spec = "name=e0,url=http://127.0.0.1:9,events=tcp://127.0.0.1:9,key-env=E0_KEY"
    result = CliRunner().invoke(main, ["front", "--model", "m", "--engine", spec])
    assert result.exit_code == 2 and "names an unset or empty variable" in result.output


def test_a_keyless_front_beyond_loopback_is_refused_before_starting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RADIXMESH_API_KEY", raising=False)
    spec = "name=e0,url=http://127.0.0.1:9,events=tcp://127.0.0.1:9"
    result = CliRunner().invoke(main, ["front", "--model", "m", "--engine", spec, "--host", "0.0.0.0"])
    assert result.exit_code == 2 and "without an API key" in result.output


@pytest.mark.parametrize(("admin", "api"), [("short", ""), ("the-same-key-0123456", "the-same-key-0123456")])
def test_a_weak_admin_key_is_refused_before_starting(admin: str, api: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RADIXMESH_API_KEY", raising=False)
    spec = "name=e0,url=http://127.0.0.1:9,events=tcp://127.0.0.1:9"
    result = CliRunner().invoke(main, ["front", "--model", "m", "--engine", spec, "--admin-key", admin, "--api-key", api])
    assert result.exit_code == 2 and "--admin-key must have at least 16 characters" in result.output


def _port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


async def test_the_api_never_binds_beyond_loopback_keyless() -> None:
    with socket.socket() as s:  # a free port, to see that nothing was bound to it
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ValueError, match="without an API key"):
        await start_http(None, "0.0.0.0", port)  # type: ignore[arg-type]
    assert _port_is_free(port)
    with pytest.raises(ValueError, match="without an API key"):
        LauncherConfig(host="")  # `up` on a Ray cluster: the node's address
    assert LauncherConfig(host="", api_key="k").host == ""
