"""A router's HTTP API as its own clients use it (`replay`, `bench`, `stats`, `route`, the demo): how
they reach it (its API key, the CA its certificate chains to) and the reports they read (/stats,
/stats/decisions).

Beyond loopback a router requires its API key and serves TLS from the cluster CA by default, so a
client that sent neither could only ever measure a loopback deployment.
"""

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp


@dataclass(frozen=True, slots=True)
class ClientAccess:
    """What a client presents to a router and what it trusts."""

    api_key: str = ""
    """The router's --api-key (empty: send none, as a keyless loopback router expects)."""
    ca_file: Path | None = None
    """A CA certificate to trust beside the system's roots (the one `up` writes); None: the roots only."""

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context()
        if self.ca_file is not None:
            context.load_verify_locations(cafile=self.ca_file)
        return context

    def session(self, **kwargs: Any) -> aiohttp.ClientSession:
        """An aiohttp session that sends the key on every request and verifies TLS against the CA."""
        return aiohttp.ClientSession(headers=self.headers(),
                                     connector=aiohttp.TCPConnector(ssl=self.ssl_context(), limit=0), **kwargs)


KEYLESS = ClientAccess()
"""A keyless router (on loopback, as local clusters and the tests run it): no key, the system's roots."""


async def router_decisions(base_url: str, after: int, access: ClientAccess = KEYLESS) -> dict[str, Any]:
    """The router's calibration report over its decisions numbered > `after` (GET /stats/decisions)."""
    async with access.session() as http, http.get(f"{base_url}/stats/decisions", params={"after": str(after)}) as r:
        r.raise_for_status()
        body: dict[str, Any] = await r.json()
        return body


class RouterUnreachable(Exception):
    """The router did not answer, or listed no model."""


async def served_model(base_url: str, access: ClientAccess = KEYLESS) -> str:
    """The model id the router at `base_url` serves: the first its /v1/models lists (as OpenAI
    clients, and vLLM's benchmarks without --model, find it). RouterUnreachable when it does not
    answer or lists none."""
    try:
        async with access.session() as http, http.get(f"{base_url.rstrip('/')}/v1/models") as r:
            r.raise_for_status()
            models = (await r.json()).get("data") or []
    except (aiohttp.ClientError, OSError, ValueError) as e:
        raise RouterUnreachable(f"router at {base_url} does not answer: {e}") from None
    if not models:
        raise RouterUnreachable(f"router at {base_url} lists no model at /v1/models")
    return str(models[0]["id"])


async def router_stats(base_url: str, access: ClientAccess = KEYLESS) -> dict[str, Any]:
    """The "router" part of the router's /stats."""
    async with access.session() as http, http.get(f"{base_url}/stats") as r:
        r.raise_for_status()
        body: dict[str, Any] = (await r.json())["router"]
        return body
