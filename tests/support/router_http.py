"""The router's HTTP API on 127.0.0.1 over two local agents, for tests: a small client (`Api`) and
its fixture."""

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest

from radixmesh.cluster.api.app import start_http
from radixmesh.common.text.tokenizer import ByteTokenizer
from radixmesh.proto.serve.sampling import SamplingParams
from tests.support.router_cluster import Cluster, local_cluster, reference

TOK = ByteTokenizer()
PROMPT = "The quick brown fox jumps over the lazy dog, again and again."


class Api:
    def __init__(self, cluster: Cluster, session: aiohttp.ClientSession, base: str) -> None:
        self.cluster, self.session, self.base = cluster, session, base

    async def post(self, path: str, body: object) -> tuple[int, Any]:
        data = body if isinstance(body, str) else json.dumps(body)
        async with self.session.post(self.base + path, data=data, headers={"Content-Type": "application/json"}) as resp:
            return resp.status, await resp.json()

    async def get(self, path: str) -> tuple[int, str]:
        async with self.session.get(self.base + path) as resp:
            return resp.status, await resp.text()

    async def sse(self, path: str, body: dict[str, Any]) -> list[str]:
        """The `data:` payloads of a streamed answer, in order."""
        async with self.session.post(self.base + path, json=body) as resp:
            assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
            raw = (await resp.read()).decode()
        events = [e for e in raw.split("\n\n") if e]
        assert all(e.startswith("data: ") for e in events)
        return [e[len("data: "):] for e in events]


@asynccontextmanager
async def serving_api(nodes: int = 2, **cluster_options: Any) -> AsyncIterator[Api]:
    """The HTTP API over a fresh `local_cluster(nodes, **cluster_options)`."""
    async with local_cluster(nodes, **cluster_options) as cluster:
        runner, port = await start_http(cluster.router, "127.0.0.1", 0)
        try:
            async with aiohttp.ClientSession() as session:
                yield Api(cluster, session, f"http://127.0.0.1:{port}")
        finally:
            await runner.cleanup()


@pytest.fixture
async def api() -> AsyncIterator[Api]:
    async with serving_api() as served:
        yield served


def greedy(text: str, max_tokens: int) -> str:
    return TOK.decode(list(reference(TOK.encode(text), SamplingParams(max_tokens=max_tokens, seed=1))))
