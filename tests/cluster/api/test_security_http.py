"""Attacks on the router's HTTP API (a real aiohttp server over real agents): requests without the API
key, bodies Python's json accepts but nothing downstream can carry, and an oversized cache_salt, each
answered with a 4xx JSON error while the next honest request gets the exact tokens; and the API over
TLS with a certificate the test makes."""

import ssl
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from radixmesh.cluster.api.app import server_tls, start_http
from tests.support.router_cluster import MODEL_NAME, local_cluster
from tests.support.router_http import greedy

pytestmark = [pytest.mark.anyio, pytest.mark.integration]
KEY = "sk-test-key"
PROMPT = "Why do shared prefixes make serving cheaper? Because the KV of a prefix is computed once."


@pytest.fixture
async def api() -> AsyncIterator[str]:
    async with local_cluster(2, publish=True) as c:
        runner, port = await start_http(c.router, "127.0.0.1", 0, api_key=KEY)
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            await runner.cleanup()


def body(**kw: object) -> dict[str, object]:
    return {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "seed": 1, **kw}


async def still_exact(http: aiohttp.ClientSession, url: str) -> None:
    async with http.post(f"{url}/v1/completions", json=body(), headers={"Authorization": f"Bearer {KEY}"}) as r:
        assert r.status == 200, await r.text()
        doc = await r.json()
    assert doc["choices"][0]["text"] == greedy(PROMPT, 8)


async def test_requests_without_the_api_key_get_401(api: str) -> None:
    async with aiohttp.ClientSession() as http:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
            for method, path in (("POST", "/v1/completions"), ("GET", "/v1/models"), ("GET", "/stats"),
                                 ("POST", "/radixmesh/route")):
                async with http.request(method, f"{api}{path}", json=body(), headers=headers) as r:
                    assert r.status == 401, (path, headers)
                    assert r.headers["WWW-Authenticate"] == "Bearer"
                    assert (await r.json())["error"]["code"] == "invalid_api_key"
        async with http.get(f"{api}/healthz") as r:
            assert r.status == 200  # probes need no key
        await still_exact(http, api)


@pytest.mark.parametrize(("raw", "message"), [
    (b'{"model": "m", "prompt": "\\ud800"}', "lone UTF-16 surrogate"),
    (b'{"model": "m", "prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nests deeper"),
    (b'{"model": "m", "prompt": "x", "max_tokens": 1' + b"0" * 5000 + b"}", "past 64 bits"),
    (b'{"model": "m", "prompt": [1' + b"0" * 30 + b"]}", "past 64 bits"),
    (b'{"model": "m", "prompt": "x", "temperature": NaN}', "NaN"),
    (b'{"model": "m", "prompt": "x", "temperature": 1e999}', "out of range"),
])
async def test_hostile_json_gets_400(api: str, raw: bytes, message: str) -> None:
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    async with aiohttp.ClientSession() as http:
        for path in ("/v1/completions", "/v1/chat/completions", "/radixmesh/route"):
            async with http.post(f"{api}{path}", data=raw, headers=headers) as r:
                assert r.status == 400, (path, await r.text())
                error = (await r.json())["error"]
                assert message in error["message"] and error["code"] == "invalid_json"
        await still_exact(http, api)


async def test_an_oversized_cache_salt_gets_400(api: str) -> None:
    headers = {"Authorization": f"Bearer {KEY}"}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{api}/v1/completions", json=body(cache_salt="s" * (1 << 20)), headers=headers) as r:
            assert r.status == 400
            assert (await r.json())["error"]["param"] == "cache_salt"
        route = {"prompt": "hello there", "cache_salt": "s" * 257}
        async with http.post(f"{api}/radixmesh/route", json=route, headers=headers) as r:
            assert r.status == 400
        await still_exact(http, api)


@pytest.fixture
def certificate(tmp_path: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key (PEM)."""
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return cert, key


async def test_the_api_over_tls_with_a_certificate_the_test_makes(certificate: tuple[Path, Path]) -> None:
    cert, key = certificate
    async with local_cluster(1) as c:
        runner, port = await start_http(c.router, "127.0.0.1", 0, api_key=KEY, tls=server_tls(cert, key))
        try:
            trusting = ssl.create_default_context(cafile=str(cert))
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=trusting)) as http:
                await still_exact(http, f"https://127.0.0.1:{port}")
            async with aiohttp.ClientSession() as http:  # a client that does not trust the certificate
                with pytest.raises(aiohttp.ClientConnectorCertificateError):
                    await http.get(f"https://127.0.0.1:{port}/healthz")
                with pytest.raises(aiohttp.ClientError):  # plain HTTP gets no answer from a TLS port
                    await http.get(f"http://127.0.0.1:{port}/healthz")
        finally:
            await runner.cleanup()
