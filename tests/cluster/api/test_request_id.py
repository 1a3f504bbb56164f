"""X-Request-Id: a caller's id names its request in the response header, the response body's id, the
router's access line and the serving agent's log lines; an unusable one is replaced by a fresh id
(issue 30)."""

import json
import logging
from collections.abc import AsyncIterator

import aiohttp
import pytest

from radixmesh.cluster.api.access_log import client_request_id
from radixmesh.cluster.api.app import start_http
from tests.support.router_cluster import MODEL_NAME, Cluster, local_cluster

pytestmark = pytest.mark.anyio

BODY = {"model": MODEL_NAME, "prompt": "Name this request.", "max_tokens": 2}


@pytest.fixture
async def served() -> AsyncIterator[tuple[Cluster, str]]:
    async with local_cluster(1) as cluster:
        runner, port = await start_http(cluster.router, "127.0.0.1", 0)
        try:
            yield cluster, f"http://127.0.0.1:{port}"
        finally:
            await runner.cleanup()


def _lines(caplog: pytest.LogCaptureFixture, logger: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == logger]


async def test_the_callers_id_reaches_the_response_the_access_line_and_the_agent_log(
        served: tuple[Cluster, str], caplog: pytest.LogCaptureFixture) -> None:
    _, url = served
    caplog.set_level(logging.INFO)
    async with (aiohttp.ClientSession() as http,
                http.post(f"{url}/v1/completions", json=BODY, headers={"X-Request-Id": "trace-42:a/b"}) as r):
        assert r.status == 200 and r.headers["X-Request-Id"] == "trace-42:a/b"
        rid = (await r.json())["id"]
    assert rid.startswith("cmpl-trace-42:a/b-") and len(rid) == len("cmpl-trace-42:a/b-") + 8
    [access] = _lines(caplog, "radixmesh.access")
    assert access.startswith("POST /v1/completions 200 ") and f" id={rid} node=a " in access
    [served_line] = [line for line in _lines(caplog, "radixmesh.node_agent.agent") if rid in line]
    assert served_line.startswith(f"request {rid} served on a: ")


async def test_two_requests_with_one_id_run_under_distinct_ids(served: tuple[Cluster, str]) -> None:
    _, url = served
    async with aiohttp.ClientSession() as http:
        ids = []
        for _ in range(2):
            async with http.post(f"{url}/v1/chat/completions", headers={"X-Request-Id": "same"},
                                 json={"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}],
                                       "max_tokens": 1}) as r:
                assert r.headers["X-Request-Id"] == "same"
                ids.append((await r.json())["id"])
    assert ids[0] != ids[1] and all(i.startswith("chatcmpl-same-") for i in ids)


async def test_a_stream_carries_the_id_in_its_header_and_chunks(served: tuple[Cluster, str]) -> None:
    _, url = served
    async with (aiohttp.ClientSession() as http,
                http.post(f"{url}/v1/completions", json={**BODY, "stream": True},
                          headers={"X-Request-Id": "stream-7"}) as r):
        assert r.headers["X-Request-Id"] == "stream-7"
        chunks = [json.loads(line[6:]) for line in (await r.text()).split("\n\n") if line.startswith("data: {")]
    assert chunks and all(c["id"].startswith("cmpl-stream-7-") for c in chunks)


@pytest.mark.parametrize("given", ["has space", "x" * 65, "quote\"d", "tab\there", "ünïcode", ""])
async def test_an_unusable_id_is_replaced_by_a_fresh_one(served: tuple[Cluster, str], given: str,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    _, url = served
    caplog.set_level(logging.INFO, logger="radixmesh.access")
    async with (aiohttp.ClientSession() as http,
                http.post(f"{url}/v1/completions", json=BODY, headers={"X-Request-Id": given}) as r):
        assert r.status == 200
        rid = (await r.json())["id"]
        assert r.headers["X-Request-Id"] == rid
    assert rid.startswith("cmpl-") and len(rid) == len("cmpl-") + 32
    assert f" id={rid} " in _lines(caplog, "radixmesh.access")[0]


async def test_every_response_carries_an_id(served: tuple[Cluster, str], caplog: pytest.LogCaptureFixture) -> None:
    _, url = served
    caplog.set_level(logging.INFO, logger="radixmesh.access")
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{url}/health", headers={"X-Request-Id": "probe-1"}) as r:
            assert r.headers["X-Request-Id"] == "probe-1"
        async with http.get(f"{url}/nowhere") as r:
            assert r.status == 404
            fresh = r.headers["X-Request-Id"]
        async with http.post(f"{url}/v1/completions", json={**BODY, "n": 0}, headers={"X-Request-Id": "bad-n"}) as r:
            assert r.status == 400 and r.headers["X-Request-Id"] == "bad-n"
    assert len(fresh) == 32 and int(fresh, 16) >= 0
    health, nowhere, refused = _lines(caplog, "radixmesh.access")
    assert " id=probe-1 node=- " in health and f" id={fresh} " in nowhere and " id=bad-n " in refused


def test_client_request_ids_are_checked() -> None:
    for good in ("a", "0f8c-11:trace/span+x=y@z.w_", "x" * 64):
        assert client_request_id(good) == good
    for bad in (None, "", "x" * 65, "a b", "a\nb", "a\\b", "é"):
        assert client_request_id(bad) is None
