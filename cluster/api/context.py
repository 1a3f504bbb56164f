"""What the handlers of the router's HTTP application share: the application's keys, the JSON
body reader, the session key a request carries, and how a refused request answers.

The body reader takes only a body declared `Content-Type: application/json` (415 otherwise): a
browser page of another origin may POST `text/plain` or a form without a CORS preflight, never
JSON, so a keyless router cannot be driven by a page its user happens to visit (CSRF). A body past
OFF_LOOP_BYTES is parsed in a worker thread (a 4 MiB list of integers takes a second to parse and
check).

The body reader refuses what Python's json module accepts but the rest of the router cannot carry:
strings with lone surrogates (valid JSON escapes that no UTF-8 encoder takes), nesting
deep enough to exhaust the stack, integers past 64 bits (and past the interpreter's 4300-digit
conversion limit), numbers that overflow a float, and NaN/Infinity (not JSON at all). Each is a 400 naming what is wrong, never a
500 from deep inside a handler."""

import asyncio
import json
import math
from collections.abc import Callable
from typing import Any

from aiohttp import web

from radixmesh.cluster.api.admin import AdminGate
from radixmesh.cluster.api.openai_schema import ApiError
from radixmesh.cluster.router.admission import Overloaded
from radixmesh.cluster.router.results import NoNodeAvailable
from radixmesh.cluster.router.router import Router
from radixmesh.common.metrics.scrape_cache import ScrapeCache
from radixmesh.common.text.chat_template import ChatTemplate
from radixmesh.common.text.tokenizer import Tokenizer
from radixmesh.proto.serve.limits import InvalidRequest

ROUTER_KEY = web.AppKey("router", Router)
CLOCK_KEY: web.AppKey[Callable[[], float]] = web.AppKey("wall_clock")
SCRAPES_KEY = web.AppKey("scrapes", ScrapeCache)
TOKENIZER_KEY: web.AppKey[Tokenizer] = web.AppKey("tokenizer")
"""The served model's tokenizer: prompts in, text out (the router routes token ids)."""
CHAT_TEMPLATE_KEY: web.AppKey[ChatTemplate] = web.AppKey("chat_template")


ADMIN_KEY = web.AppKey("admin", AdminGate)

SESSION_HEADERS = ("X-Session-Id", "X-Dynamo-Session-Id", "X-Smg-Routing-Key")
"""Session keys as Ray Serve LLM, Dynamo and SGLang's model gateway send them; the first present wins."""
MAX_SESSION_CHARS = 256


def session_key(request: web.Request) -> str | None:
    """The request's session key (SESSION_HEADERS), None without one; ApiError(400) for an empty or
    overlong one."""
    for name in SESSION_HEADERS:
        value = request.headers.get(name)
        if value is not None:
            if not 0 < len(value) <= MAX_SESSION_CHARS:
                raise ApiError(400, f"the {name} header must be 1 to {MAX_SESSION_CHARS} characters, got "
                                    f"{len(value)}", param=name, code="invalid_header")
            return value
    return None


OFF_LOOP_BYTES = 64 << 10
"""Bodies larger than this are parsed off the event loop."""


async def read_body(request: web.Request) -> object:
    """The request's JSON body; ApiError 415 when it is not declared JSON, 400 when it is not JSON."""
    if request.content_type != "application/json":
        given = request.headers.get("Content-Type")
        raise ApiError(415, "the request body must be JSON sent with Content-Type: application/json, got "
                            + ("no Content-Type" if given is None else repr(given[:100])),
                       code="unsupported_media_type")
    raw = await request.read()
    return await asyncio.to_thread(parse_json_body, raw) if len(raw) > OFF_LOOP_BYTES else parse_json_body(raw)


def refusal(e: InvalidRequest | Overloaded | NoNodeAvailable) -> ApiError:
    """The answer to a request Router.generate refused (it counted the outcome already)."""
    match e:
        case Overloaded():
            return ApiError(429, str(e), type_="requests", code="rate_limit_exceeded", counted=True,
                            headers={"Retry-After": str(math.ceil(e.retry_after_s))})
        case NoNodeAvailable():
            return ApiError(503, str(e), type_="server_error", code="no_node_available", counted=True)
        case _:
            return ApiError(400, str(e), param="prompt", code="invalid_prompt", counted=True)


MAX_DEPTH = 32
"""Nesting of arrays and objects; OpenAI bodies need 4 (messages, content parts)."""
MAX_INT = 1 << 63


def _refuse_constant(name: str) -> Any:
    raise ApiError(400, f"the request body is not valid JSON: {name} is not a JSON value", code="invalid_json")


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > 19:
        raise ApiError(400, "the request body holds an integer past 64 bits", code="invalid_json")
    value = int(text)
    if not -MAX_INT <= value < MAX_INT:
        raise ApiError(400, "the request body holds an integer past 64 bits", code="invalid_json")
    return value


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ApiError(400, f"the request body holds a number out of range: {text[:40]}", code="invalid_json")
    return value


def parse_json_body(raw: bytes) -> object:
    """The JSON value of `raw`; ApiError(400) for invalid or hostile JSON (see the module doc)."""
    try:
        value = json.loads(raw, parse_int=_bounded_int, parse_float=_finite_float, parse_constant=_refuse_constant)
    except RecursionError:
        raise ApiError(400, f"the request body nests deeper than {MAX_DEPTH} levels", code="invalid_json") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ApiError(400, f"the request body is not valid JSON: {e}", code="invalid_json") from None
    _check(value)
    return value


def _check(root: object) -> None:
    # Iterative, so a hostile body cannot make the check itself recurse.
    stack: list[tuple[object, int]] = [(root, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str):
            _check_text(value)
        elif isinstance(value, dict | list):
            if depth > MAX_DEPTH:
                raise ApiError(400, f"the request body nests deeper than {MAX_DEPTH} levels", code="invalid_json")
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for k, v in items:
                if isinstance(k, str):
                    _check_text(k)
                stack.append((v, depth + 1))


def _check_text(s: str) -> None:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise ApiError(400, "the request body holds a string with a lone UTF-16 surrogate",
                       code="invalid_json") from None
