"""The router's access log: one line per HTTP request, written when the reply has been sent.

    POST /v1/completions 200 0.231s id=cmpl-3f... node=node-1 cached_tokens=48

Handlers of generation requests fill an AccessNote on the request (id, the node that served it,
cached prompt tokens); other paths log "-" for them. Lines go to the `radixmesh.access` logger at
INFO, so `--log-level warning` or `--no-access-log` turns them off.

Text fields are escaped as nginx escapes its log: control characters (C0, DEL, C1, the Unicode line
and paragraph separators), the space and the backslash become `\\xNN` (`\\uNNNN`), so a request for
`/a%0A...` can neither start a forged line nor shift the fields of its own.
"""

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web
from aiohttp.typedefs import Middleware

logger = logging.getLogger("radixmesh.access")


@dataclass(slots=True)
class AccessNote:
    """What a generation handler learned about its request, for the access line."""

    request_id: str = "-"
    node: str = "-"
    cached_tokens: int | None = None


ACCESS_NOTE = web.RequestKey("access_note", AccessNote)

_ESCAPES = {c: (f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}")
            for c in (*range(0x21), 0x5C, *range(0x7F, 0xA0), 0x2028, 0x2029)}


def escaped(text: str) -> str:
    """`text` as one unambiguous field of a log line (see the module doc)."""
    return text.translate(_ESCAPES)


def note(request: web.Request) -> AccessNote:
    """The request's AccessNote, made on first use."""
    if ACCESS_NOTE not in request:
        request[ACCESS_NOTE] = AccessNote()
    return request[ACCESS_NOTE]


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
            n = request.get(ACCESS_NOTE) or AccessNote()
            cached = "-" if n.cached_tokens is None else str(n.cached_tokens)
            logger.info("%s %s %d %.3fs id=%s node=%s cached_tokens=%s", escaped(request.method),
                        escaped(request.path), status, clock() - start, escaped(n.request_id), escaped(n.node),
                        cached)

    return log
