"""The router's HTTP face (aiohttp): OpenAI-compatible completions and chat, vLLM's tokenizer and
probe endpoints, /stats, /metrics, the route explanation and the admin reset (the table:
docs/routing.md#endpoints). `create_app` assembles the middlewares (access log, OpenAI error
objects, the API key or the allowed Hosts) and the routes; `start_http` serves it. Headers, keys,
body checks and errors: docs/routing.md#headers-keys-and-errors.

Handlers live by concept: openai_routes (generation), ops_routes (the rest); access_log writes one line
per request.
"""

import asyncio
import hmac
import logging
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Middleware

from radixmesh.cluster.api.access_log import access_log, echo_request_id
from radixmesh.cluster.api.admin import ADMIN_PATHS, ADMIN_READ_PATHS, NO_ADMIN, AdminConfig, AdminGate
from radixmesh.cluster.api.allowed_hosts import AllowedHosts
from radixmesh.cluster.api.context import (
    ADMIN_KEY,
    CHAT_TEMPLATE_KEY,
    CLOCK_KEY,
    ROUTER_KEY,
    SCRAPES_KEY,
    TOKENIZER_KEY,
)
from radixmesh.cluster.api.openai_routes import add_openai_routes
from radixmesh.cluster.api.openai_schema import ApiError
from radixmesh.cluster.api.ops_routes import add_operation_routes
from radixmesh.cluster.observability.file_sd import FileSdConfig, FileSdPublisher
from radixmesh.cluster.observability.stats_log import StatsLogger
from radixmesh.cluster.router.router import Router
from radixmesh.common.cluster_ca import server_tls, server_tls_pem
from radixmesh.common.metrics.scrape_cache import ScrapeCache
from radixmesh.common.secret import check_api_bind
from radixmesh.common.text.chat_template import ChatTemplate, PlainChatTemplate
from radixmesh.common.text.tokenizer import ByteTokenizer, Tokenizer

logger = logging.getLogger(__name__)

__all__ = ["create_app", "server_tls", "server_tls_pem", "start_http"]

OPEN_PATHS = frozenset({"/healthz", "/health"})
"""Paths served without the API key: probes (they say nothing but "up")."""
METRICS_PATH = "/metrics"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json_error(e: ApiError) -> web.Response:
    return web.json_response(e.body(), status=e.status, headers=e.headers)


@web.middleware
async def _errors(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                  ) -> web.StreamResponse:
    """Every failure as OpenAI's error object: ours, aiohttp's (404, 405, 413) and unexpected ones."""
    try:
        return await handler(request)
    except ApiError as e:
        if request.path.startswith("/v1/") and not e.counted:
            request.app[ROUTER_KEY].metrics.record_request("invalid" if e.status < 500 else "unavailable")
        return _json_error(e)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        return _json_error(ApiError(e.status, e.reason, code=str(e.status)))
    except Exception:
        logger.exception("unexpected error serving %s %s", request.method, request.path)
        return _json_error(ApiError(500, "internal error", type_="server_error", code="internal_error"))


def _api_key_check(api_key: str, metrics_token: str, admin: AdminGate) -> Middleware:
    expected = f"Bearer {api_key}".encode()
    scrape = f"Bearer {metrics_token}".encode() if metrics_token else None

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        given = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
        path = request.path
        # Admin paths are the admin key's alone (their handlers check it): the API key never opens them.
        if (path in OPEN_PATHS or path in ADMIN_PATHS or hmac.compare_digest(given, expected)
                or (path in ADMIN_READ_PATHS and admin.is_admin(request))
                or (scrape is not None and path == METRICS_PATH and hmac.compare_digest(given, scrape))):
            return await handler(request)
        response = _json_error(ApiError(401, "missing or wrong API key (Authorization: Bearer <key>)",
                                        code="invalid_api_key"))
        response.headers["WWW-Authenticate"] = "Bearer"
        return response

    return check


def create_app(router: Router, *, tokenizer: Tokenizer | None = None, chat_template: ChatTemplate | None = None,
               wall_clock: Callable[[], float] = time.time,
               clock: Callable[[], float] = time.monotonic, client_max_size: int = 4 << 20, api_key: str = "",
               metrics_token: str = "", allowed_hosts: AllowedHosts | None = None,
               stats_interval_s: float | None = 10.0, log_access: bool = True, admin: AdminConfig = NO_ADMIN
               ) -> web.Application:
    """The aiohttp application over `router`, turning text into token ids and back with `tokenizer` and
    `chat_template` (None: the byte tokenizer, the plain template); `wall_clock` stamps `created`
    fields, `clock` ages the /metrics render. A non-empty `api_key` is required on every path but OPEN_PATHS (/metrics also
    takes a non-empty `metrics_token`); without one, only `allowed_hosts` are answered (None: IP
    literals and localhost); the admin endpoints need `admin.key` (api.admin; none: 403).
    Every `stats_interval_s` a summary line is logged (stats_log; None: never); `log_access` writes
    one access_log line per request."""
    middlewares: list[Middleware] = [access_log()] if log_access else []
    middlewares.append(_errors)
    gate = AdminGate(admin, clock)
    if api_key:
        middlewares.append(_api_key_check(api_key, metrics_token, gate))
    else:
        middlewares.append((allowed_hosts or AllowedHosts(frozenset())).middleware())
    app = web.Application(middlewares=middlewares, client_max_size=client_max_size)
    app.on_response_prepare.append(echo_request_id)
    app[ROUTER_KEY] = router
    app[TOKENIZER_KEY] = tokenizer or ByteTokenizer()
    app[CHAT_TEMPLATE_KEY] = chat_template or PlainChatTemplate()
    app[ADMIN_KEY] = gate
    app[CLOCK_KEY] = wall_clock
    app[SCRAPES_KEY] = ScrapeCache(clock=clock)
    add_openai_routes(app)
    add_operation_routes(app)
    if stats_interval_s is not None:
        app.cleanup_ctx.append(_background("router-stats-log", StatsLogger(router, stats_interval_s).run))
    return app


def _background(name: str, run: Callable[[], Coroutine[Any, Any, None]]
                ) -> Callable[[web.Application], AsyncIterator[None]]:
    """A cleanup context that runs `run()` as a task while the application serves."""
    async def lifetime(app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(run(), name=name)
        yield
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return lifetime


async def start_http(router: Router, host: str, port: int, *, tokenizer: Tokenizer | None = None,
                     chat_template: ChatTemplate | None = None, api_key: str = "",
                     tls: ssl.SSLContext | None = None, log_access: bool = True,
                     file_sd: FileSdConfig | None = None, allowed_hosts: Iterable[str] = (),
                     admin: AdminConfig = NO_ADMIN) -> tuple[web.AppRunner, int]:
    """Serve `router` on host:port (0: a free port), over HTTPS with `tls` (a server context, see
    `server_tls`), with create_app's `tokenizer` and `chat_template`; returns the runner (`await runner.cleanup()` stops it) and the bound port. With
    `file_sd` the router keeps a Prometheus target list of itself and its agents (file_sd), and its
    /metrics takes the metrics token written beside it. Without an API key it answers the Host names
    of AllowedHosts.serving(host, allowed_hosts) and IP literals only, and refuses (ValueError) to bind
    beyond loopback without one."""
    check_api_bind(host, api_key)
    # handler_cancellation: a client that disconnects cancels its handler, which aborts the request on
    # its agent (aiohttp otherwise lets a non-streaming handler run to its end).
    app = create_app(router, tokenizer=tokenizer, chat_template=chat_template, api_key=api_key,
                     log_access=log_access, admin=admin,
                     metrics_token=(file_sd.metrics_token or "") if file_sd is not None else "",
                     allowed_hosts=AllowedHosts.serving(host, allowed_hosts))
    publisher = FileSdPublisher(router, file_sd) if file_sd is not None else None
    if publisher is not None:  # its loop starts with the app and waits for the bound port
        app.cleanup_ctx.append(_background("router-file-sd", publisher.run))
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=tls)
    await site.start()
    bound = int(runner.addresses[0][1])
    if publisher is not None:
        await publisher.listen_at(f"{host}:{bound}", "https" if tls is not None else "http")
    logger.info("router HTTP API on %s://%s:%d", "https" if tls is not None else "http", host, bound)
    return runner, bound
