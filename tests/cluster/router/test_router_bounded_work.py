"""Work one HTTP caller can make the router do is bounded (issue 28, findings 5 and 6): a prompt too
long for the context is refused before it is tokenized; tokenizing runs off the event loop, so
probes answer meanwhile; N concurrent /metrics scrapes make one fan-out to the agents, which is
reused for a second and needs the key when the deployment has one."""

import asyncio
import threading
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer

from radixmesh.cluster.api.app import create_app, start_http
from radixmesh.cluster.api.prompt_tokens import MAX_CHARS_PER_TOKEN, max_prompt_chars
from radixmesh.cluster.fleet.agent_client import StaticAgentDirectory
from radixmesh.cluster.router.config import RouterConfig
from radixmesh.cluster.router.router import Router
from radixmesh.common.metrics.scrape import ScrapeTarget
from radixmesh.common.metrics.scrape_cache import ScrapeCache
from radixmesh.common.text.tokenizer import BYTE_VOCAB_SIZE, ByteTokenizer
from radixmesh.proto.ids import NodeId
from radixmesh.proto.serve.limits import InvalidRequest, PromptLimits
from radixmesh.proto.serve.plan import ServeItem, ServePlan

pytestmark = [pytest.mark.anyio]
MODEL = "radixmesh"
CONTEXT = 64
KEY = "sk-router-key"
TOKEN = "metrics-token"
JSON = {"Content-Type": "application/json"}


class CountingTokenizer(ByteTokenizer):
    """The byte tokenizer, counting encodes; `gate()` makes each encode wait for `release` (in the
    thread that runs it) and say whether it came."""

    def __init__(self) -> None:
        self.encodes = 0
        self.started = threading.Event()
        self.release: threading.Event | None = None
        self.released: list[bool] = []

    def gate(self) -> threading.Event:
        self.release = threading.Event()
        return self.release

    def encode(self, text: str) -> list[int]:
        self.encodes += 1
        self.started.set()
        if self.release is not None:
            # Bounded, so that a loop this blocks (the old code) wakes up and the test fails instead of hanging.
            self.released.append(self.release.wait(10))
        return super().encode(text)


class ScrapedAgent:
    """An AgentClient whose Prometheus text counts the renders it was asked for."""

    def __init__(self, node: str) -> None:
        self.node = NodeId(node)
        self.renders = 0

    async def serve(self, plan: ServePlan) -> AsyncGenerator[ServeItem, None]:
        raise AssertionError("these tests route nothing")
        yield  # pragma: no cover  (makes this an async generator)

    async def prometheus_text(self) -> str:
        self.renders += 1
        return ("# HELP radixmesh_engine_steps Steps.\n# TYPE radixmesh_engine_steps counter\n"
                f"radixmesh_engine_steps_total {self.renders}.0\n")

    async def scrape_target(self) -> ScrapeTarget | None:
        return None


def make_router(agents: tuple[ScrapedAgent, ...] = ()) -> Router:
    config = RouterConfig(layout="test", model_name=MODEL,
                          limits=PromptLimits(vocab_size=BYTE_VOCAB_SIZE, max_context_tokens=CONTEXT))
    return Router(config, StaticAgentDirectory(agents), None)


@asynccontextmanager
async def serving(router: Router, tokenizer: CountingTokenizer | None = None
                  ) -> AsyncIterator[tuple[aiohttp.ClientSession, str]]:
    runner, port = await start_http(router, "127.0.0.1", 0, tokenizer=tokenizer, log_access=False)
    try:
        async with aiohttp.ClientSession() as http:
            yield http, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def post(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with http.post(url, json=body) as r:
        return r.status, await r.json()


TOO_LONG = "x" * (MAX_CHARS_PER_TOKEN * CONTEXT + 1)
HUGE_BODIES = [
    ("/tokenize", {"prompt": TOO_LONG}, "prompt"),
    ("/tokenize", {"messages": [{"role": "user", "content": TOO_LONG}]}, "messages"),
    ("/v1/completions", {"model": MODEL, "prompt": TOO_LONG, "max_tokens": 1}, "prompt"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": TOO_LONG}]}, "messages"),
    ("/radixmesh/route", {"prompt": TOO_LONG}, "prompt"),
]


@pytest.mark.parametrize(("path", "body", "param"), HUGE_BODIES, ids=[f"{p}-{q}" for p, _, q in HUGE_BODIES])
async def test_a_prompt_longer_than_the_context_can_hold_is_refused_before_tokenizing(
        path: str, body: dict[str, Any], param: str) -> None:
    tokenizer = CountingTokenizer()
    async with serving(make_router(), tokenizer) as (http, url):
        status, answer = await post(http, url + path, body)
    assert status == 400, answer
    assert (answer["error"]["code"], answer["error"]["param"]) == ("context_length_exceeded", param)
    assert f"{max_prompt_chars(make_router().config.limits)}" in answer["error"]["message"]
    assert tokenizer.encodes == 0


async def test_a_chat_whose_rendered_prompt_is_too_long_is_refused_before_tokenizing() -> None:
    # Contents within the bound; the template's per-message text pushes the prompt past it.
    messages = [{"role": "user", "content": ""}] * (MAX_CHARS_PER_TOKEN * CONTEXT // 8)
    tokenizer = CountingTokenizer()
    async with serving(make_router(), tokenizer) as (http, url):
        status, answer = await post(http, url + "/tokenize", {"messages": messages})
    assert status == 400 and answer["error"]["code"] == "context_length_exceeded"
    assert tokenizer.encodes == 0


async def test_the_longest_allowed_prompt_is_tokenized_and_a_reply_is_at_most_a_context() -> None:
    """Issue 38 item 13: /tokenize answered with every id of a 4 MiB text, seconds of serializing."""
    tokenizer = CountingTokenizer()
    async with serving(make_router(), tokenizer) as (http, url):
        status, answer = await post(http, url + "/tokenize", {"prompt": TOO_LONG[:-1]})
        assert tokenizer.encodes == 1  # within the character bound: tokenized
        assert status == 400 and answer["error"]["code"] == "context_length_exceeded"
        assert f"{MAX_CHARS_PER_TOKEN * CONTEXT} tokens" in answer["error"]["message"]
        status, answer = await post(http, url + "/tokenize", {"prompt": "y" * CONTEXT})
    assert status == 200 and answer["count"] == CONTEXT


async def test_a_prompt_of_too_many_token_ids_is_refused_by_its_length() -> None:
    """Issue 38 item 13: a million ids were each checked on the loop before the length was compared."""
    async with serving(make_router()) as (http, url):
        body = {"model": MODEL, "prompt": [1] * (CONTEXT + 1) + ["not an id"], "max_tokens": 1}
        status, answer = await post(http, url + "/v1/completions", body)
    assert status == 400 and answer["error"]["code"] == "context_length_exceeded"
    with pytest.raises(InvalidRequest, match="exceeds the context"):  # one rule: the length before the ids
        PromptLimits(vocab_size=4, max_context_tokens=4).check([9] * 4, 1)


OFF_LOOP = [
    ("/tokenize", {"prompt": "hello"}, 200),
    ("/v1/completions", {"model": MODEL, "prompt": "hello", "max_tokens": 1}, 503),  # no agent: tokenized, then 503
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 1},
     503),
]


@pytest.mark.parametrize(("path", "body", "status"), OFF_LOOP, ids=[p for p, _, _ in OFF_LOOP])
async def test_probes_answer_while_a_prompt_is_being_tokenized(path: str, body: dict[str, Any], status: int) -> None:
    tokenizer = CountingTokenizer()
    release = tokenizer.gate()
    async with serving(make_router(), tokenizer) as (http, url):
        request = asyncio.create_task(post(http, url + path, body))
        assert await asyncio.to_thread(tokenizer.started.wait, 10)
        async with http.get(url + "/health") as probe:  # while the encode still waits for its release
            assert probe.status == 200
        release.set()
        got, _ = await request
    assert got == status
    assert tokenizer.released == [True]  # the encode ended by the release, not by its deadline


async def test_concurrent_scrapes_make_one_fan_out_to_the_agents_until_it_is_a_second_old() -> None:
    agents = (ScrapedAgent("a"), ScrapedAgent("b"))
    now = [100.0]
    app = create_app(make_router(agents=agents), clock=lambda: now[0], stats_interval_s=None, log_access=False)
    async with TestClient(TestServer(app)) as client:
        async def scrape(**params: str) -> str:
            async with client.get("/metrics", params=params) as r:
                assert r.status == 200
                return await r.text()

        texts = await asyncio.gather(*(scrape() for _ in range(8)))
        assert [a.renders for a in agents] == [1, 1]
        assert len(set(texts)) == 1 and 'radixmesh_engine_steps_total{node="b"} 1.0' in texts[0]
        now[0] += 0.99
        assert await scrape() == texts[0]
        await scrape(scope="router")  # another scope is another render
        assert [a.renders for a in agents] == [2, 2]
        now[0] += 1.0
        assert 'radixmesh_engine_steps_total{node="a"} 3.0' in await scrape()


async def test_a_failed_render_is_not_reused() -> None:
    cache, calls = ScrapeCache(clock=lambda: 0.0), []

    async def render() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise ValueError("an agent's text does not parse")
        return "ok"

    with pytest.raises(ValueError):
        await cache.text("", render)
    assert await cache.text("", render) == "ok" and await cache.text("", render) == "ok"
    assert len(calls) == 2


async def test_scrapes_waiting_on_a_running_render_share_it() -> None:
    cache, release, calls = ScrapeCache(ttl_s=0.0), asyncio.Event(), []
    started = asyncio.Event()

    async def render() -> str:
        calls.append(1)
        started.set()
        await release.wait()
        return f"render {len(calls)}"

    scrapes = [asyncio.create_task(cache.text("", render)) for _ in range(8)]
    await started.wait()  # the render task runs after the 8 scrapes that were scheduled before it
    release.set()
    assert await asyncio.gather(*scrapes) == ["render 1"] * 8
    assert await cache.text("", render) == "render 2"  # ttl 0: an ended render is not reused


async def test_with_an_api_key_metrics_takes_the_key_or_the_metrics_token_and_nothing_else() -> None:
    app = create_app(make_router(agents=(ScrapedAgent("a"),)), api_key=KEY, metrics_token=TOKEN,
                     stats_interval_s=None, log_access=False)
    async with TestClient(TestServer(app)) as client:
        for headers, status in (({}, 401), ({"Authorization": "Bearer wrong"}, 401),
                                ({"Authorization": f"Bearer {KEY}"}, 200), ({"Authorization": f"Bearer {TOKEN}"}, 200)):
            async with client.get("/metrics", headers=headers) as r:
                assert r.status == status, headers
                if status == 401:
                    assert r.headers["WWW-Authenticate"] == "Bearer"
                    assert (await r.json())["error"]["code"] == "invalid_api_key"
        async with client.get("/v1/models", headers={"Authorization": f"Bearer {TOKEN}"}) as r:
            assert r.status == 401  # the scrape token opens /metrics only
        async with client.get("/healthz") as r:
            assert r.status == 200
