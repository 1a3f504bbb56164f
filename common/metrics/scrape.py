"""Each agent's own Prometheus endpoint, so Prometheus scrapes every agent itself and `up` shows each.

    GET /metrics    the agent's exposition (NodeAgent.prometheus_text), labelled node and model_name

Access: open plain text on a loopback address (only this machine reaches it, as the router's
/metrics); on any other address a scrape must carry `Authorization: Bearer <metrics token>`, a key
derived from the cluster secret, over TLS with a certificate the agent mints for its address from the
secret's cluster CA (docs/security.md#tls; `up --no-tls`: plain text). Prometheus sends the token from
`authorization: {credentials_file: ...}` and verifies against `tls_config.ca_file`; the router writes
both next to its file-SD target list (cluster.observability.file_sd).
"""

import hmac
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from radixmesh.common.cluster_ca import ClusterCa, ServerCertificate, server_tls_pem
from radixmesh.common.metrics.scrape_cache import ScrapeCache
from radixmesh.common.secret import ClusterSecret, KeyPurpose, is_loopback
from radixmesh.proto.ids import NodeId

logger = logging.getLogger(__name__)


def metrics_token(secret: ClusterSecret) -> str:
    """Bearer token of agents' /metrics on non-loopback addresses (Prometheus' credentials)."""
    return secret.key(KeyPurpose.METRICS_SCRAPE).hex()


@dataclass(frozen=True, slots=True)
class ScrapeTarget:
    """One endpoint Prometheus should scrape, with the labels its samples get (file-SD's "labels")."""

    address: str
    """host:port of its /metrics."""
    node: NodeId | None
    """The agent's node id; None for the router itself."""
    zone: str = ""
    """The Ray node's availability zone ("": unknown)."""
    params: tuple[tuple[str, str], ...] = field(default=())
    """URL parameters of the scrape (file-SD labels __param_<name>)."""
    scheme: str = "http"
    """"https" for an endpoint that serves TLS (file-SD label __scheme__)."""


class MetricsServer:
    """GET /metrics over aiohttp on host:port (0: a free one). Start and stop from one event loop."""

    def __init__(self, render: Callable[[], Coroutine[Any, Any, str]], host: str, port: int, token: str | None,
                 cache: ScrapeCache | None = None, tls: ServerCertificate | None = None) -> None:
        """`token` None: no authorization; only allowed on a loopback `host` (ValueError otherwise).
        `cache`: where renders are kept (default: one a second, as the router's /metrics). `tls`:
        serve https with this certificate (plain HTTP then gets no answer); None: plain text."""
        if token is None and not is_loopback(host):
            raise ValueError(f"an agent's /metrics on {host!r} needs the cluster secret's metrics token")
        self.tls = tls
        self._context = None if tls is None else server_tls_pem(tls.cert_chain, tls.private_key)
        self._render = render
        # Each render runs on the engine thread: a scrape flood must not make one render per GET
        # (issue 38: 200 GETs were 200 renders, and requests slowed tenfold).
        self._cache = cache or ScrapeCache()
        self._host, self._port = host, port
        self._expected = None if token is None else f"Bearer {token}".encode()
        self._runner: web.AppRunner | None = None
        self.address = ""
        """host:port it listens on, once started."""

    @classmethod
    def for_agent(cls, render: Callable[[], Coroutine[Any, Any, str]], host: str, port: int, secret: ClusterSecret,
                  tls: bool = True) -> "MetricsServer":
        """An agent's endpoint on `host`: open plain text on loopback; beyond it, the metrics token, over
        TLS unless `tls` is False (`up --no-tls`). Every holder of the secret derives the same CA, so
        the agent mints its own certificate for `host` (a fresh key each start) and Prometheus, which
        trusts that CA, verifies it with nothing distributed."""
        if is_loopback(host):
            return cls(render, host, port, None)
        served = ClusterCa.derive(secret).issue([host]) if tls else None
        return cls(render, host, port, metrics_token(secret), tls=served)

    @property
    def scheme(self) -> str:
        """"https" when it serves TLS, else "http" (its scrape target's __scheme__)."""
        return "http" if self.tls is None else "https"

    async def start(self) -> str:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self._host, self._port, ssl_context=self._context)
        await site.start()
        self._runner = runner
        self.address = f"{self._host}:{int(runner.addresses[0][1])}"
        logger.info("agent /metrics on %s://%s/metrics%s", self.scheme, self.address,
                    "" if self._expected is None else " (bearer token required)")
        return self.address

    async def stop(self) -> None:
        """Idempotent."""
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def _metrics(self, request: web.Request) -> web.Response:
        if self._expected is not None:
            given = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
            if not hmac.compare_digest(given, self._expected):
                return web.json_response({"error": "missing or wrong metrics token (Authorization: Bearer ...)"},
                                         status=401, headers={"WWW-Authenticate": "Bearer"})
        return web.Response(text=await self._cache.text("", self._render), content_type="text/plain", charset="utf-8",
                            headers={"X-Prometheus-Format": "0.0.4"})
