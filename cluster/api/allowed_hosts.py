"""Which `Host` a router without an API key answers: its defence against DNS rebinding.

A page on evil.example can have its name re-resolved to 127.0.0.1 (or to the router's private
address) and then call the router as its own origin: the browser sends `Host: evil.example`. A
keyless router therefore answers only Hosts that no attacker's DNS can produce: IP literals,
`localhost`, the name it was bound to, the machine's own host name, and the names the operator
allows. With an API key the check is moot (the page cannot know the key) and is not made.
"""

import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from radixmesh.cluster.api.openai_schema import ApiError


def host_name(header: str) -> str | None:
    """The lower-case name (or IP literal, without brackets) of a Host header; None when it is no host."""
    try:
        parsed = urlsplit(f"//{header}")
        parsed.port  # noqa: B018  (raises ValueError for a port that is not a number)
    except ValueError:
        return None
    if parsed.username is not None or parsed.path or parsed.query or parsed.fragment or not parsed.hostname:
        return None
    return parsed.hostname.rstrip(".")


@dataclass(frozen=True, slots=True)
class AllowedHosts:
    names: frozenset[str]
    """Host names (lower case, no port, no trailing dot) answered beside IP literals and `localhost`."""

    @classmethod
    def serving(cls, bound_host: str, extra: Iterable[str] = ()) -> "AllowedHosts":
        """The names of a router bound to `bound_host` (an address or a name): that name, this
        machine's host name, and `extra`."""
        names = {bound_host, socket.gethostname(), *extra}
        return cls(frozenset(n.lower().rstrip(".") for n in names if n))

    def permits(self, header: str | None) -> bool:
        if header is None:  # browsers always send Host: a client without one is not a rebound page
            return True
        name = host_name(header)
        if name is None:
            return False
        if name == "localhost" or name in self.names:
            return True
        try:
            ipaddress.ip_address(name)
        except ValueError:
            return False
        return True

    def middleware(self) -> Middleware:
        """421 (OpenAI's error object) for a request whose Host this router does not answer."""

        @web.middleware
        async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
            header = request.headers.get("Host")
            if not self.permits(header):
                raise ApiError(421, f"this router does not answer Host {header!r}: without an API key it "
                                    "answers only its IP addresses, localhost and its own names (DNS rebinding "
                                    "defence); use one of them, add the name to the allowed hosts, or set an "
                                    "API key", code="misdirected_request")
            return await handler(request)

        return check
