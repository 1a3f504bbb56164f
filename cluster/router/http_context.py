"""What the handlers of the router's HTTP application share: the application's keys, the JSON
body reader, and how a refused request answers."""

import math
from collections.abc import Callable

from aiohttp import web

from radixmesh.cluster.router.admission import Overloaded
from radixmesh.cluster.router.json_body import parse_json_body
from radixmesh.cluster.router.openai_schema import ApiError
from radixmesh.cluster.router.routed import NoNodeAvailable
from radixmesh.cluster.router.router import Router
from radixmesh.proto.serve.limits import InvalidRequest

ROUTER_KEY = web.AppKey("router", Router)
CLOCK_KEY: web.AppKey[Callable[[], float]] = web.AppKey("wall_clock")


async def read_body(request: web.Request) -> object:
    return parse_json_body(await request.read())


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

