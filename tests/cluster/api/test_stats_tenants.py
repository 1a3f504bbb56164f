"""GET /stats never shows a tenant's cache_salt (issue 38 item 3): with one read there, another client
could read that tenant's cache. The API key sees no per-tenant table; the admin key sees each tenant
under a keyed digest of its salt (api.admin.tenant_label). Real router, agents and metadata service."""

import json
from collections.abc import AsyncIterator

import aiohttp
import pytest

from radixmesh.cluster.api.admin import AdminConfig, admin_key, tenant_label
from radixmesh.cluster.api.app import start_http
from tests.support.poll import until
from tests.support.router_cluster import MODEL_NAME, SECRET, Cluster, local_cluster

pytestmark = [pytest.mark.anyio, pytest.mark.integration]
KEY = "sk-tenant-key"
ADMIN = admin_key(SECRET)
SALT = "victim-salt-7f3a"
PROMPT = "A prompt that fills a few blocks, so that the victim's tenant has cached tokens to count."


@pytest.fixture
async def served() -> AsyncIterator[tuple[Cluster, str]]:
    async with local_cluster(1, publish=True) as cluster:
        runner, port = await start_http(cluster.router, "127.0.0.1", 0, api_key=KEY, admin=AdminConfig(ADMIN))
        try:
            yield cluster, f"http://127.0.0.1:{port}"
        finally:
            await runner.cleanup()


async def _stats(http: aiohttp.ClientSession, url: str, key: str) -> tuple[int, str]:
    async with http.get(f"{url}/stats", headers={"Authorization": f"Bearer {key}"}) as r:
        return r.status, await r.text()


async def test_stats_show_no_salt_and_tenants_only_to_the_admin(served: tuple[Cluster, str]) -> None:
    cluster, url = served
    async with aiohttp.ClientSession() as http:
        body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 2, "cache_salt": SALT}
        async with http.post(f"{url}/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}) as r:
            assert r.status == 200
        service = cluster.service
        await until(lambda: SALT in service.hits.stats().per_tenant, "the agent to report the tenant's hits")
        status, text = await _stats(http, url, KEY)
        assert status == 200 and SALT not in text
        assert "tenants" not in json.loads(text)["metadata"]
        status, text = await _stats(http, url, ADMIN)
        assert status == 200 and SALT not in text
        tenants = json.loads(text)["metadata"]["tenants"]
        label = tenant_label(ADMIN, SALT)
        assert label.startswith("t-") and tenants[label]["requests"] == 1
        async with http.get(f"{url}/stats", headers={"Authorization": "Bearer wrong"}) as r:
            assert r.status == 401
