"""The router's HTTP face (aiohttp): OpenAI-compatible completions and chat, plus /stats, /metrics,
/healthz.

    POST /v1/completions        prompt text or token ids; SSE when "stream": true
    POST /v1/chat/completions   messages rendered by chat_template; SSE when "stream": true
    GET  /v1/models             the one model served; /v1/models/{id} that model, or 404
    POST /tokenize              vLLM's: {"prompt"} or {"messages"} -> {"tokens", "count", "max_model_len"}
    POST /detokenize            vLLM's: {"tokens"} -> {"prompt"}
    GET  /health                vLLM's liveness probe: 200 with an empty body while the router serves
    GET  /version               {"version": radixmesh's version}
    GET  /stats                 JSON: the router's own counters and the metadata service's GetStats
    GET  /metrics               Prometheus: the router's metrics and every agent's, labelled `node`
    GET  /healthz               200 while some agent is known, else 503
    POST /radixmesh/route       {"prompt", "max_tokens", "cache_salt"}: serve it once and explain the route
                                (router.explain.RouteReport), what `radixmesh route` prints

With an API key (`start_http(..., api_key=...)`, `radixmesh up --api-key`) every path but /healthz
and /metrics needs `Authorization: Bearer <key>` (as vLLM's --api-key); without one: 401.

Every error is OpenAI's JSON error object with a 4xx/5xx status. A stream whose first token never
comes answers with a plain error status (the SSE response starts only with the first item); an
error after that ends the stream with an `error` event, which the openai client raises.
"""

import asyncio
import hmac
import importlib.metadata
import json
import logging
import math
import ssl
import tempfile
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, NamedTuple

from aiohttp import web
from aiohttp.typedefs import Middleware

from radixmesh.cluster.router.admission import Overloaded
from radixmesh.cluster.router.explain import explain
from radixmesh.cluster.router.json_body import parse_json_body
from radixmesh.cluster.router.metrics import merge_expositions, stats_document
from radixmesh.cluster.router.openai_schema import (
    ApiError,
    ChatResponseShape,
    GenerationParams,
    ResponseShape,
    parse_chat,
    parse_completion,
    usage,
)
from radixmesh.cluster.router.router import (
    GenerateRequest,
    NoNodeAvailable,
    Router,
    RouterItem,
    RouterResult,
)
from radixmesh.cluster.router.stats_log import StatsLogger
from radixmesh.proto.cluster_secret import is_loopback
from radixmesh.proto.metadata.limits import MAX_TENANT_CHARS
from radixmesh.proto.serve.limits import InvalidRequest
from radixmesh.proto.serve.plan import TokenDelta
from radixmesh.proto.serve.sampling import SamplingParams
from radixmesh.proto.serve.stop_strings import StopStrings

logger = logging.getLogger(__name__)

ROUTE_PATH = "/radixmesh/route"
ROUTER_KEY = web.AppKey("router", Router)
CLOCK_KEY: web.AppKey[Callable[[], float]] = web.AppKey("wall_clock")
OPEN_PATHS = frozenset({"/healthz", "/health", "/metrics"})
"""Paths served without the API key: probes and Prometheus scrapes (no prompts, no tenant names)."""
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


def _api_key_check(api_key: str) -> Middleware:
    expected = f"Bearer {api_key}".encode()

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        given = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
        if request.path in OPEN_PATHS or hmac.compare_digest(given, expected):
            return await handler(request)
        response = _json_error(ApiError(401, "missing or wrong API key (Authorization: Bearer <key>)",
                                        code="invalid_api_key"))
        response.headers["WWW-Authenticate"] = "Bearer"
        return response

    return check


def create_app(router: Router, *, wall_clock: Callable[[], float] = time.time,
               client_max_size: int = 4 << 20, api_key: str = "",
               stats_interval_s: float | None = 10.0) -> web.Application:
    """The aiohttp application over `router`; `wall_clock` stamps `created` fields; a non-empty
    `api_key` is required on every path but OPEN_PATHS; every `stats_interval_s` a summary line is
    logged (stats_log; None: never)."""
    middlewares: list[Middleware] = [_errors] if not api_key else [_errors, _api_key_check(api_key)]
    app = web.Application(middlewares=middlewares, client_max_size=client_max_size)
    app[ROUTER_KEY] = router
    app[CLOCK_KEY] = wall_clock
    app.router.add_post("/v1/completions", _completions)
    app.router.add_post("/v1/chat/completions", _chat)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/v1/models/{model_id}", _model)
    app.router.add_post("/tokenize", _tokenize)
    app.router.add_post("/detokenize", _detokenize)
    app.router.add_get("/health", _health)
    app.router.add_get("/version", _version)
    app.router.add_get("/stats", _stats)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/healthz", _healthz)
    app.router.add_post(ROUTE_PATH, _route)
    if stats_interval_s is not None:
        app.cleanup_ctx.append(_periodic_stats(StatsLogger(router, stats_interval_s)))
    return app


def _periodic_stats(stats: StatsLogger) -> Callable[[web.Application], AsyncIterator[None]]:
    async def lifetime(app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(stats.run(), name="router-stats-log")
        yield
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return lifetime


async def start_http(router: Router, host: str, port: int, *, api_key: str = "",
                     tls: ssl.SSLContext | None = None) -> tuple[web.AppRunner, int]:
    """Serve `router` on host:port (0: a free port), over HTTPS with `tls` (a server context, see
    `server_tls`); returns the runner (`await runner.cleanup()` stops it) and the bound port."""
    if not api_key and not is_loopback(host):
        logger.warning("the OpenAI API on %s needs no API key: anyone who reaches it can use it (--api-key)", host)
    # handler_cancellation: a client that disconnects cancels its handler, which aborts the request on
    # its agent (aiohttp otherwise lets a non-streaming handler run to its end).
    runner = web.AppRunner(create_app(router, api_key=api_key), access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=tls)
    await site.start()
    bound = int(runner.addresses[0][1])
    logger.info("router HTTP API on http://%s:%d", host, bound)
    return runner, bound


def server_tls(cert_chain: Path, private_key: Path) -> ssl.SSLContext:
    """A TLS server context from PEM files (TLS 1.2 or later); OSError/ssl.SSLError when unreadable."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_chain, private_key)
    return context


def server_tls_pem(cert_chain: bytes, private_key: bytes) -> ssl.SSLContext:
    """`server_tls` from PEM bytes (ssl loads keys only from files: they live in a private temporary
    directory for the duration of the load)."""
    with tempfile.TemporaryDirectory() as d:
        cert, key = Path(d) / "cert.pem", Path(d) / "key.pem"
        cert.write_bytes(cert_chain)
        key.write_bytes(private_key)
        return server_tls(cert, key)


# --- OpenAI endpoints ---------------------------------------------------------------------------
async def _body(request: web.Request) -> object:
    return parse_json_body(await request.read())


async def _completions(request: web.Request) -> web.StreamResponse:
    router = request.app[ROUTER_KEY]
    _admit(router)
    parsed = parse_completion(await _body(request))
    prompt = parsed.prompt
    tokens = tuple(router.tokenizer.encode(prompt)) if isinstance(prompt, str) else prompt
    return await _generate(request, parsed.params, tokens, "cmpl", ResponseShape())


async def _chat(request: web.Request) -> web.StreamResponse:
    router = request.app[ROUTER_KEY]
    _admit(router)
    parsed = parse_chat(await _body(request))
    try:
        prompt = router.chat_template.render(parsed.messages)
    except ValueError as e:  # the model's template refused the conversation
        raise ApiError(400, str(e), param="messages", code="invalid_messages") from e
    tokens = tuple(router.tokenizer.encode(prompt))
    return await _generate(request, parsed.params, tokens, "chatcmpl", ChatResponseShape())


async def _generate(request: web.Request, params: GenerationParams, tokens: tuple[int, ...], prefix: str,
                    shape: ResponseShape) -> web.StreamResponse:
    router = request.app[ROUTER_KEY]
    if params.model != router.config.model_name:
        raise ApiError(404, f"model {params.model!r} does not exist; this server serves "
                            f"{router.config.model_name!r}", param="model", code="model_not_found")
    rid = f"{prefix}-{uuid.uuid4().hex}"
    limits = router.config.limits
    bad_stop = next((t for t in params.stop_token_ids if t >= limits.vocab_size), None)
    if bad_stop is not None:
        raise ApiError(400, f"stop token id {bad_stop} is outside the vocabulary [0, {limits.vocab_size})",
                       param="stop_token_ids", code="invalid_value")
    # Omitted max_tokens: the rest of the context (at least 1, so a prompt that fills it is refused below).
    max_tokens = params.max_tokens or max(1, limits.max_context_tokens - len(tokens))
    try:
        sampling = SamplingParams(max_tokens=max_tokens, temperature=params.temperature, top_p=params.top_p,
                                  seed=params.seed, stop_token_ids=params.stop_token_ids,
                                  ignore_eos=params.ignore_eos, stop=params.stop)
        job = GenerateRequest(rid, tokens, sampling, params.cache_salt)
        router.validate(job)
    except ValueError as e:
        raise ApiError(400, str(e), param="prompt", code="invalid_prompt") from e
    ids = (rid, int(request.app[CLOCK_KEY]()), params.model)
    items = router.generate(job)
    reply = _reply(router, items, params)
    try:
        if params.stream:
            return await _stream(request, reply, ids, params, shape)
        pieces = [piece async for piece in reply]
    except (InvalidRequest, Overloaded, NoNodeAvailable) as e:
        raise _refusal(e) from e
    finally:
        await reply.aclose()
        await items.aclose()  # a client gone before the end: aborts the request on its agent
    end = pieces.pop()
    assert isinstance(end, _End)
    text = "".join(p for p in pieces if isinstance(p, str))
    return web.json_response(shape.envelope(shape.kind, ids, shape.full_choice(text, end.finish_reason), end.usage))


def _admit(router: Router) -> None:
    """Refuse a request for capacity before its body is even read."""
    try:
        router.admission.check()
    except Overloaded as e:
        router.metrics.record_request("refused")
        raise _refusal(e) from e


def _refusal(e: InvalidRequest | Overloaded | NoNodeAvailable) -> ApiError:
    """The answer to a request Router.generate refused (it counted the outcome already)."""
    match e:
        case Overloaded():
            return ApiError(429, str(e), type_="requests", code="rate_limit_exceeded", counted=True,
                            headers={"Retry-After": str(math.ceil(e.retry_after_s))})
        case NoNodeAvailable():
            return ApiError(503, str(e), type_="server_error", code="no_node_available", counted=True)
        case _:
            return ApiError(400, str(e), param="prompt", code="invalid_prompt", counted=True)


class _End(NamedTuple):
    """How a reply ended: the last item of `_reply`."""

    finish_reason: str
    usage: dict[str, Any]


async def _reply(router: Router, items: AsyncIterator[RouterItem], params: GenerationParams
                 ) -> AsyncGenerator[str | _End, None]:
    """The reply's text in pieces (some empty), then one _End. The agent's engine ends a request on
    the token that completes a stop string; the same check here cuts the text right before it."""
    text = router.tokenizer.stream()  # holds back a cut character until later tokens complete it
    stops = StopStrings(params.stop) if params.stop else None
    async for item in items:
        if isinstance(item, TokenDelta):
            piece = text.push(item.token_ids)
            yield piece if stops is None else stops.push(piece).text
            continue
        finish, tail = item.result.finish_reason.value, text.flush()
        if stops is not None:
            check = stops.push(tail)
            tail = check.text if check.stopped else check.text + stops.flush()
        yield tail
        yield _End(finish, _usage(item))
        return
    raise AssertionError("the router's stream ended without a result")


def _usage(result: RouterResult) -> dict[str, Any]:
    return usage(result.result.stats.prompt_tokens, len(result.result.output_token_ids), result.cached_tokens)


async def _stream(request: web.Request, reply: AsyncIterator[str | _End], ids: tuple[str, int, str],
                  params: GenerationParams, shape: ResponseShape) -> web.StreamResponse:
    # The first item is awaited before the response starts, so routing failures keep their status.
    first = await anext(reply)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    usage_obj = None  # chunks carry "usage": null; a last chunk carries it when asked for
    opened = False

    async def send(body: dict[str, Any] | str) -> None:
        data = body if isinstance(body, str) else json.dumps(body)
        await response.write(f"data: {data}\n\n".encode())

    async def emit(item: str | _End) -> None:
        nonlocal opened
        if isinstance(item, str):
            if item or not opened:
                await send(shape.envelope(shape.chunk_kind, ids, shape.delta_choice(item, not opened, None), usage_obj))
                opened = True
            return
        await send(shape.envelope(shape.chunk_kind, ids, shape.delta_choice("", False, item.finish_reason), usage_obj))
        if params.include_usage:
            await send(shape.envelope(shape.chunk_kind, ids, None, item.usage))

    try:
        await emit(first)
        async for item in reply:
            await emit(item)
    except (NoNodeAvailable, InvalidRequest) as e:
        status, kind = (503, "server_error") if isinstance(e, NoNodeAvailable) else (400, "invalid_request_error")
        logger.warning("stream %s failed after it started: %s", ids[0], e)
        await send(ApiError(status, str(e), type_=kind).body())
    except ConnectionResetError:
        # The client left; closing the router's items (by the caller) aborts the request on its agent.
        logger.info("client of stream %s disconnected", ids[0])
        return response
    await send("[DONE]")
    await response.write_eof()
    return response


# --- operations ----------------------------------------------------------------------------------
def _model_card(router: Router) -> dict[str, Any]:
    return {"id": router.config.model_name, "object": "model", "created": 0, "owned_by": "radixmesh",
            "max_model_len": router.config.limits.max_context_tokens}


async def _models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [_model_card(request.app[ROUTER_KEY])]})


async def _model(request: web.Request) -> web.Response:
    router = request.app[ROUTER_KEY]
    if request.match_info["model_id"] != router.config.model_name:
        raise ApiError(404, f"model {request.match_info['model_id']!r} does not exist; this server serves "
                            f"{router.config.model_name!r}", param="model", code="model_not_found")
    return web.json_response(_model_card(router))


async def _tokenize(request: web.Request) -> web.Response:
    """vLLM's /tokenize: a prompt as the router tokenizes it (a chat as its template renders it)."""
    router = request.app[ROUTER_KEY]
    body = await _body(request)
    unknown = sorted(body.keys() - {"model", "prompt", "messages"}) if isinstance(body, dict) else []
    if unknown:  # the OpenAI endpoints' policy: no field is silently ignored
        raise ApiError(400, f"unrecognized request argument supplied: '{unknown[0]}'", param=unknown[0],
                       code="unknown_parameter")
    if isinstance(body, dict) and "messages" in body:
        try:
            chat = parse_chat({"model": router.config.model_name, "messages": body["messages"]})
            text = router.chat_template.render(chat.messages)
        except ValueError as e:
            raise ApiError(400, str(e), param="messages", code="invalid_messages") from e
    elif isinstance(body, dict) and isinstance(body.get("prompt"), str):
        text = body["prompt"]
    else:
        raise ApiError(400, "the body must be a JSON object with a string 'prompt' or a 'messages' list",
                       param="prompt")
    tokens = router.tokenizer.encode(text)
    return web.json_response({"tokens": tokens, "count": len(tokens),
                              "max_model_len": router.config.limits.max_context_tokens})


async def _detokenize(request: web.Request) -> web.Response:
    router = request.app[ROUTER_KEY]
    body = await _body(request)
    tokens = body.get("tokens") if isinstance(body, dict) else None
    vocab = router.config.limits.vocab_size
    if not (isinstance(tokens, list) and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab
                                             for t in tokens)):
        raise ApiError(400, f"'tokens' must be a list of token ids in [0, {vocab})", param="tokens")
    return web.json_response({"prompt": router.tokenizer.decode(tokens)})


async def _health(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def _version(request: web.Request) -> web.Response:
    return web.json_response({"version": importlib.metadata.version("radixmesh")})


async def _healthz(request: web.Request) -> web.Response:
    router = request.app[ROUTER_KEY]
    nodes = router.directory.nodes()
    body = {"status": "ok" if nodes else "no_nodes", "nodes": len(nodes),
            "metadata_available": router.metadata_available, "policy": router.active_policy}
    return web.json_response(body, status=200 if nodes else 503)


async def _stats(request: web.Request) -> web.Response:
    router = request.app[ROUTER_KEY]
    cluster = await router.cluster_stats()
    inflight = {n: router.inflight(n) for n in router.directory.nodes()}
    body = stats_document(router.metrics, cluster, policy=router.config.policy, active_policy=router.active_policy,
                          metadata_available=router.metadata_available, inflight=inflight)
    return web.json_response(body)


async def _metrics(request: web.Request) -> web.Response:
    router = request.app[ROUTER_KEY]
    text = merge_expositions(router.metrics.render(), await router.agent_metrics())
    return web.Response(text=text, content_type="text/plain", charset="utf-8",
                        headers={"X-Prometheus-Format": "0.0.4"})


async def _route(request: web.Request) -> web.Response:
    """Serve one prompt and say where it went, why, and where its prompt tokens came from."""
    router = request.app[ROUTER_KEY]
    body = await _body(request)
    if not isinstance(body, dict) or not isinstance(body.get("prompt"), str):
        raise ApiError(400, "the body must be a JSON object with a string 'prompt'", param="prompt")
    unknown = sorted(body.keys() - {"prompt", "max_tokens", "cache_salt"})
    if unknown:  # the OpenAI endpoints' policy: no field is silently ignored
        raise ApiError(400, f"unrecognized request argument supplied: '{unknown[0]}'", param=unknown[0],
                       code="unknown_parameter")
    max_tokens, cache_salt = body.get("max_tokens", 16), body.get("cache_salt", "")
    if not (isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens >= 1):
        raise ApiError(400, "'max_tokens' must be an integer >= 1", param="max_tokens")
    if not isinstance(cache_salt, str) or len(cache_salt) > MAX_TENANT_CHARS:
        raise ApiError(400, f"'cache_salt' must be a string of at most {MAX_TENANT_CHARS} characters",
                       param="cache_salt")
    job = GenerateRequest(f"route-{uuid.uuid4().hex}", tuple(router.tokenizer.encode(body["prompt"])),
                          SamplingParams(max_tokens=max_tokens), cache_salt)
    try:
        result = await router.complete(job)
    except (InvalidRequest, Overloaded, NoNodeAvailable) as e:
        raise _refusal(e) from e
    report = explain(result, router.tokenizer.decode(list(result.result.output_token_ids)))
    return web.json_response(asdict(report))
