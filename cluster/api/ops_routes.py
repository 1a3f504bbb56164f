"""The router's operational endpoints: models, tokenizer, probes, statistics, metrics, route
explanations, and the prefix-cache reset (POST /reset_prefix_cache, SGLang's /flush_cache too).

The reset is an admin endpoint: only the admin key opens it (api.admin; 403 otherwise, loopback or
not), at most one runs per AdminConfig.reset_interval_s (429 with Retry-After), and `?wait=true`
waits for the router's running requests (409 `requests_running` without it). /stats shows the
per-tenant table only to the admin. Its answers, code by code: docs/routing.md#endpoints.
"""

import asyncio
import importlib.metadata
import math
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from aiohttp import web

from radixmesh.cluster.api.access_log import note
from radixmesh.cluster.api.context import (
    ADMIN_KEY,
    CHAT_TEMPLATE_KEY,
    ROUTER_KEY,
    SCRAPES_KEY,
    TOKENIZER_KEY,
    read_body,
    refusal,
)
from radixmesh.cluster.api.explain import ROUTE_PATH, explain
from radixmesh.cluster.api.openai_schema import ApiError, parse_chat
from radixmesh.cluster.api.prompt_tokens import chat_tokens, text_tokens
from radixmesh.cluster.fleet.reports import agent_metrics, cluster_stats
from radixmesh.cluster.observability.endpoints import merge_expositions, stats_document
from radixmesh.cluster.observability.file_sd import ROUTER_SCOPE
from radixmesh.cluster.router.admission import Overloaded
from radixmesh.cluster.router.cache_reset import RequestsRunning
from radixmesh.cluster.router.results import NoNodeAvailable
from radixmesh.cluster.router.router import Router
from radixmesh.proto.metadata.limits import MAX_TENANT_CHARS
from radixmesh.proto.serve.limits import InvalidRequest
from radixmesh.proto.serve.plan import ServePlan
from radixmesh.proto.serve.sampling import SamplingParams


def add_operation_routes(app: web.Application) -> None:
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/v1/models/{model_id}", _model)
    app.router.add_post("/tokenize", _tokenize)
    app.router.add_post("/detokenize", _detokenize)
    app.router.add_get("/health", _health)
    app.router.add_get("/version", _version)
    app.router.add_get("/stats", _stats)
    app.router.add_get("/stats/decisions", _decisions)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/healthz", _healthz)
    app.router.add_post(ROUTE_PATH, _route)
    app.router.add_post("/reset_prefix_cache", _reset_prefix_cache)
    app.router.add_post("/flush_cache", _reset_prefix_cache)


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
    """vLLM's /tokenize: a prompt as the API tokenizes it (a chat as its template renders it)."""
    router = request.app[ROUTER_KEY]
    body = await read_body(request)
    unknown = sorted(body.keys() - {"model", "prompt", "messages"}) if isinstance(body, dict) else []
    if unknown:  # the OpenAI endpoints' policy: no field is silently ignored
        raise ApiError(400, f"unrecognized request argument supplied: '{unknown[0]}'", param=unknown[0],
                       code="unknown_parameter")
    if isinstance(body, dict) and "messages" in body:
        chat = parse_chat({"model": router.config.model_name, "messages": body["messages"]})
        tokens = await chat_tokens(request.app[TOKENIZER_KEY], request.app[CHAT_TEMPLATE_KEY], router.config.limits,
                                   chat.messages)
    elif isinstance(body, dict) and isinstance(body.get("prompt"), str):
        tokens = await text_tokens(request.app[TOKENIZER_KEY], router.config.limits, body["prompt"])
    else:
        raise ApiError(400, "the body must be a JSON object with a string 'prompt' or a 'messages' list",
                       param="prompt")
    limit = router.config.limits.max_context_tokens
    if len(tokens) > limit:  # as vLLM's: and a reply of millions of ids took seconds to serialize (issue 38)
        raise ApiError(400, f"the prompt is {len(tokens)} tokens: more than the context of {limit} tokens",
                       param="prompt", code="context_length_exceeded")
    return web.json_response({"tokens": tokens, "count": len(tokens), "max_model_len": limit})


async def _detokenize(request: web.Request) -> web.Response:
    """vLLM's /detokenize, for at most a context's worth of ids (no model emits more), decoded off the loop."""
    router = request.app[ROUTER_KEY]
    body = await read_body(request)
    tokens = body.get("tokens") if isinstance(body, dict) else None
    limits = router.config.limits
    if not (isinstance(tokens, list) and len(tokens) <= limits.max_context_tokens
            and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < limits.vocab_size for t in tokens)):
        raise ApiError(400, f"'tokens' must be a list of at most {limits.max_context_tokens} token ids in "
                            f"[0, {limits.vocab_size})", param="tokens")
    return web.json_response({"prompt": await asyncio.to_thread(request.app[TOKENIZER_KEY].decode, tokens)})


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
    cluster = await cluster_stats(router.metadata, router.config.match_timeout_s)
    inflight = {n: router.inflight(n) for n in router.directory.nodes()}
    admin = request.app[ADMIN_KEY]
    # Tenants' salts are their caches' keys: never shown; the admin sees keyed digests of them.
    body = stats_document(router.metrics, cluster, policy=router.config.policy, active_policy=router.active_policy,
                          metadata_available=router.metadata_available, inflight=inflight,
                          tenant_label=admin.tenant_label if admin.is_admin(request) else None)
    return web.json_response(body)


async def _decisions(request: web.Request) -> web.Response:
    """The calibration report (cluster/router/calibration.py) over the decisions numbered > `after`."""
    raw = request.query.get("after", "0")
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 18):
        raise ApiError(400, f"'after' must be a decision number >= 0, got {raw[:40]!r}", param="after")
    return web.json_response(request.app[ROUTER_KEY].metrics.calibration.report(int(raw)))


async def _metrics(request: web.Request) -> web.Response:
    """The merged exposition, rendered at most once a second per scope (common.metrics.scrape_cache)."""
    router = request.app[ROUTER_KEY]
    # scope=router (the router's file-SD target): leave out the agents Prometheus scrapes itself.
    scope = ROUTER_SCOPE if request.query.get("scope") == ROUTER_SCOPE else ""

    async def render() -> str:
        exclude = router.scraped_nodes if scope == ROUTER_SCOPE else frozenset()
        parts = [router.watcher.stats()] if router.watcher is not None else []
        return merge_expositions(router.metrics.render(*parts), await agent_metrics(
            router.directory, router.config.match_timeout_s * 4, exclude))

    text = await request.app[SCRAPES_KEY].text(scope, render)
    return web.Response(text=text, content_type="text/plain", charset="utf-8",
                        headers={"X-Prometheus-Format": "0.0.4"})


async def _route(request: web.Request) -> web.Response:
    """Serve one prompt and say where it went, why, and where its prompt tokens came from."""
    router = request.app[ROUTER_KEY]
    body = await read_body(request)
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
    tokenizer = request.app[TOKENIZER_KEY]
    job = ServePlan(note(request).generation_id("route"), await text_tokens(tokenizer, router.config.limits, body["prompt"]),
                    SamplingParams(max_tokens=max_tokens), cache_salt)
    try:
        result = await router.complete(job)
    except (InvalidRequest, Overloaded, NoNodeAvailable) as e:
        raise refusal(e) from e
    report = explain(result, tokenizer.decode(list(result.result.output_token_ids)))
    return web.json_response(asdict(report))


DEFAULT_RESET_WAIT_S = 60.0
MAX_RESET_WAIT_S = 3600.0


async def _reset_prefix_cache(request: web.Request) -> web.Response:
    """Drop every agent's cached blocks (Router.reset_prefix_cache); see the module doc."""
    admin = request.app[ADMIN_KEY]
    admin.require(request)
    body = await read_body(request) if request.body_exists else {}
    wait, timeout = _reset_options(request.query, body)
    admin.start_reset()
    ran = False
    try:
        reset = await request.app[ROUTER_KEY].reset_prefix_cache(wait_s=timeout if wait else None)
        ran = True
    except RequestsRunning as e:
        raise ApiError(409, f"{e}; nothing was reset", code="requests_running") from e
    finally:
        admin.end_reset(ran)
    nodes: dict[str, Any] = {
        **{n: {"status": "reset", "dropped_blocks": d} for n, d in reset.dropped.items()},
        **{n: {"status": "busy", "error": why} for n, why in reset.busy.items()},
        **{n: {"status": "failed", "error": why} for n, why in reset.failed.items()},
    }
    total = sum(sum(d.values()) for d in reset.dropped.values())
    if reset.busy or reset.failed:
        status, code = (409, "requests_running") if reset.busy else (503, "reset_incomplete")
        error = ApiError(status, f"{len(reset.busy) + len(reset.failed)} of {len(nodes)} node(s) were not reset: "
                                 + "; ".join(f"{n}: {v['error']}" for n, v in sorted(nodes.items()) if "error" in v),
                         type_="server_error" if status == 503 else "invalid_request_error", code=code)
        return web.json_response({**error.body(), "dropped_blocks": total, "nodes": nodes}, status=status)
    return web.json_response({"status": "ok", "dropped_blocks": total, "nodes": nodes})


def _reset_options(query: Mapping[str, str], body: object) -> tuple[bool, float]:
    """(wait, timeout seconds) from the query string or the JSON body; ApiError(400) for anything else."""
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object", code="invalid_json")
    unknown = sorted(body.keys() - {"wait", "timeout"})
    if unknown:
        raise ApiError(400, f"unrecognized request argument supplied: '{unknown[0]}'", param=unknown[0],
                       code="unknown_parameter")
    wait = body.get("wait", _query_bool(query, "wait"))
    if not isinstance(wait, bool):
        raise ApiError(400, "'wait' must be true or false", param="wait")
    timeout: object = body["timeout"] if "timeout" in body else query.get("timeout", DEFAULT_RESET_WAIT_S)
    if isinstance(timeout, str) and "timeout" not in body:  # the query's text
        try:
            timeout = float(timeout)
        except ValueError:
            pass
    if not (isinstance(timeout, int | float) and not isinstance(timeout, bool) and math.isfinite(timeout)
            and 0 < timeout <= MAX_RESET_WAIT_S):
        raise ApiError(400, f"'timeout' must be a number of seconds in (0, {MAX_RESET_WAIT_S:g}]", param="timeout")
    return wait, float(timeout)


def _query_bool(query: Mapping[str, str], name: str) -> bool | str:
    value = query.get(name, "false").lower()
    return {"true": True, "1": True, "false": False, "0": False}.get(value, value)
