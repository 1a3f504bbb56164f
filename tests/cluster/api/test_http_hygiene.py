"""HTTP hygiene of the router's API (issue 28, finding 12): an access line cannot be forged through the
path, a POST body must be declared JSON (a cross-origin page can send text/plain without a
preflight), a router without an API key answers only Hosts no attacker's DNS can produce (DNS
rebinding), and `stop_token_ids` is capped."""

import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest

from radixmesh.cluster.api.access_log import escaped
from radixmesh.cluster.api.allowed_hosts import AllowedHosts, host_name
from radixmesh.cluster.api.app import start_http
from radixmesh.cluster.api.openai_schema import MAX_STOP_TOKEN_IDS, ApiError, parse_completion
from radixmesh.cluster.fleet.agent_client import StaticAgentDirectory
from radixmesh.cluster.router.config import RouterConfig
from radixmesh.cluster.router.router import Router

pytestmark = [pytest.mark.anyio]
MODEL = "radixmesh"
KEY = "sk-router-key"


@asynccontextmanager
async def serving(*, api_key: str = "", allowed_hosts: tuple[str, ...] = (), log_access: bool = False
                  ) -> AsyncIterator[tuple[aiohttp.ClientSession, str]]:
    """The API over a router with no agents (nothing here is routed) on 127.0.0.1."""
    router = Router(RouterConfig(layout="test", model_name=MODEL), StaticAgentDirectory([]), None)
    runner, port = await start_http(router, "127.0.0.1", 0, api_key=api_key, log_access=log_access,
                                    allowed_hosts=allowed_hosts)
    try:
        async with aiohttp.ClientSession() as http:
            yield http, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_a_newline_in_the_path_cannot_forge_an_access_line(caplog: pytest.LogCaptureFixture) -> None:
    forged = "/x%0AGET%20/v1/completions%20200%200.001s%20id=forged%0D%1B[2J"
    async with serving(log_access=True) as (http, url):
        with caplog.at_level(logging.INFO, logger="radixmesh.access"):
            async with http.get(url + forged) as r:
                assert r.status == 404
    [line] = [r.getMessage() for r in caplog.records if r.name == "radixmesh.access"]
    assert line.startswith("GET /x\\x0aGET\\x20/v1/completions\\x20200\\x200.001s\\x20id=forged\\x0d\\x1b[2J 404 ")
    assert len(line.split(" ")) == 7  # method path status time id node cached_tokens


def test_escaped_leaves_printable_text_and_escapes_every_separator() -> None:
    assert escaped("/v1/completions") == "/v1/completions"
    assert escaped("née-1") == "née-1"
    assert escaped("a b\\c\td\x7fe\x85f\u2028g") == "a\\x20b\\x5cc\\x09d\\x7fe\\x85f\\u2028g"


POSTS = [
    ("/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 1}),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}),
    ("/tokenize", {"prompt": "hi"}),
    ("/detokenize", {"tokens": [104, 105]}),
    ("/radixmesh/route", {"prompt": "hi"}),
]


@pytest.mark.parametrize(("path", "body"), POSTS, ids=[p for p, _ in POSTS])
@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
async def test_a_post_body_not_declared_json_gets_415(path: str, body: dict[str, Any], content_type: str | None
                                                      ) -> None:
    headers = {} if content_type is None else {"Content-Type": content_type}
    async with serving() as (http, url):
        # skip_auto_headers: aiohttp would otherwise declare the bytes application/octet-stream
        async with http.post(url + path, data=json.dumps(body).encode(), headers=headers,
                             skip_auto_headers=("Content-Type",)) as r:
            assert r.status == 415
            error = (await r.json())["error"]
        assert error["code"] == "unsupported_media_type"
        assert ("no Content-Type" if content_type is None else content_type) in error["message"]


async def test_json_with_a_charset_is_served() -> None:
    async with serving() as (http, url), http.post(url + "/tokenize", data=b'{"prompt": "hi"}',
                                                   headers={"Content-Type": "Application/JSON; charset=utf-8"}) as r:
        assert r.status == 200 and (await r.json())["tokens"] == [104, 105]


@pytest.mark.parametrize("host", ["evil.example", "evil.example:80", "localhost.evil.example", "127.0.0.1.nip.io",
                                  "user@127.0.0.1", "", "a b"])
async def test_without_an_api_key_a_foreign_host_gets_421(host: str) -> None:
    async with serving() as (http, url):
        for method, path in (("GET", "/v1/models"), ("POST", "/tokenize"), ("GET", "/metrics")):
            async with http.request(method, url + path, json={"prompt": "hi"}, headers={"Host": host}) as r:
                assert r.status == 421, (path, host)
                assert (await r.json())["error"]["code"] == "misdirected_request"


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.1:8000", "localhost:8000", "LOCALHOST.", "[::1]:8000",
                                  "10.0.0.7", "router.lan:8000", "Router.LAN."])
async def test_without_an_api_key_addresses_localhost_and_allowed_names_are_served(host: str) -> None:
    async with serving(allowed_hosts=("router.lan",)) as (http, url), \
            http.get(url + "/v1/models", headers={"Host": host}) as r:
        assert r.status == 200, host


async def test_with_an_api_key_any_host_is_served() -> None:
    headers = {"Host": "evil.example", "Authorization": f"Bearer {KEY}"}
    async with serving(api_key=KEY) as (http, url), http.get(url + "/v1/models", headers=headers) as r:
        assert r.status == 200


def test_host_names_are_parsed_as_browsers_send_them() -> None:
    assert host_name("Example.COM:8080") == "example.com"
    assert host_name("[::1]:80") == "::1"
    assert host_name("localhost.") == "localhost"
    assert host_name("a:b") is None and host_name("x/y") is None and host_name("") is None
    assert AllowedHosts(frozenset()).permits(None)  # HTTP/1.0 without Host: no browser sends that


def test_stop_token_ids_are_capped() -> None:
    body = {"model": MODEL, "prompt": "hi"}
    ids = list(range(MAX_STOP_TOKEN_IDS))
    assert parse_completion({**body, "stop_token_ids": ids}).params.stop_token_ids == tuple(ids)
    with pytest.raises(ApiError) as refused:
        parse_completion({**body, "stop_token_ids": [*ids, MAX_STOP_TOKEN_IDS]})
    assert (refused.value.status, refused.value.param) == (400, "stop_token_ids")


async def test_too_many_stop_token_ids_get_400_over_http() -> None:
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 1, "stop_token_ids": [7] * 10_000}
    async with serving() as (http, url), http.post(url + "/v1/completions", json=body) as r:
        assert r.status == 400
        error = (await r.json())["error"]
    assert error["param"] == "stop_token_ids" and f"at most {MAX_STOP_TOKEN_IDS}" in error["message"]
