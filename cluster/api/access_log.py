"""The router's access log: one line per HTTP request, written when the reply has been sent.

    POST /v1/completions 200 0.231s id=cmpl-3f... node=node-1 cached_tokens=48

Every request has an id (the caller's `X-Request-Id` when a log line can carry it, else a fresh
one), echoed on every response; a generation runs under an id derived from it. Lines go to the
`radixmesh.access` logger at INFO; text fields are escaped as nginx escapes its log, so a request
can neither forge a line nor shift its fields. The ids and the escaping: docs/routing.md#access-log.
"""

import asyncio
import logging
import re
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web
from aiohttp.typedefs import Middleware

logger = logging.getLogger("radixmesh.access")


REQUEST_ID_HEADER = "X-Request-Id"
REQUEST_ID = re.compile(r"[A-Za-z0-9._:@/+=-]{1,64}")
"""A caller's request id we carry: no separator, quote or control character a log line could trip on,
and short enough that a generation's id (prefix, suffix, choice number) stays within the metadata
service's request-id limit."""


def client_request_id(value: str | None) -> str | None:
    """`value` (an X-Request-Id header) when it matches REQUEST_ID, else None (a fresh id is used)."""
    return value if value is not None and REQUEST_ID.fullmatch(value) else None


@dataclass(slots=True)
class AccessNote:
    """The request's id, and what a generation handler learned about it, for the access line."""

    client_id: str | None
    """The caller's X-Request-Id, when usable (client_request_id)."""
    request_id: str
    """The id the access line logs: a generation's own, else the caller's or a fresh one."""
    node: str = "-"
    cached_tokens: int | None = None

    def generation_id(self, prefix: str) -> str:
        """A new generation request's id (see the module doc), which becomes the logged id too."""
        self.request_id = (f"{prefix}-{self.client_id}-{uuid.uuid4().hex[:8]}" if self.client_id is not None
                           else f"{prefix}-{uuid.uuid4().hex}")
        return self.request_id


ACCESS_NOTE = web.RequestKey("access_note", AccessNote)

_ESCAPES = {c: (f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}")
            for c in (*range(0x21), 0x5C, *range(0x7F, 0xA0), 0x2028, 0x2029)}


def escaped(text: str) -> str:
    """`text` as one unambiguous field of a log line (see the module doc)."""
    return text.translate(_ESCAPES)


def note(request: web.Request) -> AccessNote:
    """The request's AccessNote, made on first use."""
    if ACCESS_NOTE not in request:
        client = client_request_id(request.headers.get(REQUEST_ID_HEADER))
        request[ACCESS_NOTE] = AccessNote(client, client if client is not None else uuid.uuid4().hex)
    return request[ACCESS_NOTE]


async def echo_request_id(request: web.Request, response: web.StreamResponse) -> None:
    """An on_response_prepare signal handler: the response's X-Request-Id is the caller's usable one,
    else the id the request ran under."""
    n = note(request)
    response.headers[REQUEST_ID_HEADER] = n.client_id if n.client_id is not None else n.request_id


def access_log(clock: Callable[[], float] = time.monotonic) -> Middleware:
    """The middleware; outermost, so the time covers a whole stream and the status is the final one."""

    @web.middleware
    async def log(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                  ) -> web.StreamResponse:
        start = clock()
        status = 500  # an exception that escapes every handler becomes aiohttp's 500
        try:
            response = await handler(request)
            status = response.status
            return response
        except asyncio.CancelledError:
            status = 499  # the client went away before the reply ended (nginx's code for it)
            raise
        finally:
            n = note(request)
            cached = "-" if n.cached_tokens is None else str(n.cached_tokens)
            logger.info("%s %s %d %.3fs id=%s node=%s cached_tokens=%s", escaped(request.method),
                        escaped(request.path), status, clock() - start, escaped(n.request_id), escaped(n.node),
                        cached)

    return log
