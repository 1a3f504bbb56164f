"""Who may call the router's admin endpoints, how often, and how /stats names tenants.

The admin key is derived from the cluster secret (KeyPurpose.HTTP_ADMIN), never the client API key:
a tenant's key must not wipe every tenant's cache (issue 38). It is scoped: it opens ADMIN_PATHS
and the per-tenant table of /stats, nothing else (a leaked admin key serves no completions). A
router without one (no secret) answers the admin endpoints with 403, loopback or not.

A reset is rate-limited per router: one that ran (dropped something or tried to) starts a quiet
period of `reset_interval_s`, and one at a time; both refusals are 429 with Retry-After.

/stats never shows a tenant's `cache_salt`: knowing another tenant's salt is knowing how to read its
cache. The admin sees each tenant as HMAC-SHA256(admin key, salt), which an operator who knows a
salt can compute (`tenant_label`) and nobody else can invert.
"""

import hashlib
import hmac
import math
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from radixmesh.cluster.api.openai_schema import ApiError
from radixmesh.common.secret import ClusterSecret, KeyPurpose

ADMIN_PATHS = frozenset({"/reset_prefix_cache", "/flush_cache"})
"""Paths only the admin key opens."""
ADMIN_READ_PATHS = frozenset({"/stats"})
"""Paths the admin key opens beside the API key (the admin then sees more)."""
TENANT_LABEL_CHARS = 16


def admin_key(secret: ClusterSecret) -> str:
    """The router's admin bearer token, derived from the cluster secret (hex)."""
    return secret.key(KeyPurpose.HTTP_ADMIN).hex()


def tenant_label(key: str, salt: str) -> str:
    """How /stats names the tenant `salt` to the admin: a keyed one-way digest, never the salt."""
    if not salt or salt.startswith("("):  # the default tenant "" and the "(other)" bucket are no secret
        return salt
    return "t-" + hmac.new(key.encode(), salt.encode("utf-8", "surrogateescape"),
                           hashlib.sha256).hexdigest()[:TENANT_LABEL_CHARS]


@dataclass(frozen=True, slots=True)
class AdminConfig:
    """The router's admin access."""

    key: str = ""
    """Bearer token of the admin endpoints (admin_key(secret)); "": they answer 403."""
    reset_interval_s: float = 10.0
    """Least time between two resets that ran."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.reset_interval_s) and self.reset_interval_s >= 0):
            raise ValueError(f"reset_interval_s must be a finite number >= 0, got {self.reset_interval_s}")


NO_ADMIN = AdminConfig()
"""No admin key: the admin endpoints answer 403."""


class AdminGate:
    """Checks the admin key and paces resets. Use from one event loop."""

    def __init__(self, config: AdminConfig, clock: Callable[[], float]) -> None:
        self.config = config
        self._expected = f"Bearer {config.key}".encode() if config.key else None
        self._clock = clock
        self._last_reset: float | None = None
        self._resetting = False

    def is_admin(self, request: web.Request) -> bool:
        given = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
        return self._expected is not None and hmac.compare_digest(given, self._expected)

    def require(self, request: web.Request) -> None:
        """ApiError 403 unless `request` carries the admin key."""
        if self._expected is None:
            raise ApiError(403, f"{request.path} needs the admin key, and this router has none (it is derived "
                                "from the cluster secret: start the router with one)", code="admin_disabled")
        if not self.is_admin(request):
            raise ApiError(403, f"{request.path} needs the admin key (Authorization: Bearer <admin key>); the API "
                                "key does not open it", code="admin_key_required")

    def start_reset(self) -> None:
        """ApiError 429 while a reset runs or within reset_interval_s of the last one that ran."""
        wait = 0.0 if self._last_reset is None else self._last_reset + self.config.reset_interval_s - self._clock()
        if self._resetting or wait > 0:
            raise ApiError(429, "a prefix-cache reset " + ("is running" if self._resetting else
                                                            f"ran less than {self.config.reset_interval_s:g} s ago"),
                           type_="requests", code="rate_limit_exceeded",
                           headers={"Retry-After": str(max(1, math.ceil(wait)))})
        self._resetting = True

    def end_reset(self, ran: bool) -> None:
        """`ran`: the reset dropped (or tried to drop) blocks, so the quiet period starts now."""
        self._resetting = False
        if ran:
            self._last_reset = self._clock()

    def tenant_label(self, salt: str) -> str:
        return tenant_label(self.config.key, salt)
