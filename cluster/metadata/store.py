"""StateStore: where the metadata service keeps what must outlive it.

Three kinds of state, each written in the shape the service already has: node records (opaque bytes
by node id), cumulative counters (integers by scope and field, only ever incremented) and the latest
index snapshot (one opaque blob). The in-memory store is the default and dies with the process; the
Redis store lets a restarted service answer Match and GetStats at once, before nodes resync.
"""

import logging
from abc import ABC, abstractmethod
from collections.abc import Mapping
from urllib.parse import urlsplit, urlunsplit

import redis

logger = logging.getLogger(__name__)

CounterDeltas = Mapping[str, Mapping[str, int]]
"""scope ("total", "node:<id>", "tenant:<name>") -> field -> increment."""


class StateStore(ABC):
    """Durable state of the metadata service. Calls are synchronous and short; all raise on failure."""

    @abstractmethod
    def save_node(self, node: str, record: bytes) -> None:
        """Create or replace the record of `node`."""

    @abstractmethod
    def load_nodes(self) -> dict[str, bytes]:
        """Every node record saved so far."""

    @abstractmethod
    def add_counters(self, deltas: CounterDeltas) -> None:
        """Atomically add `deltas` to the cumulative counters."""

    @abstractmethod
    def load_counters(self) -> dict[str, dict[str, int]]:
        """Every counter, by scope then field."""

    @abstractmethod
    def save_index(self, blob: bytes) -> None:
        """Replace the stored index snapshot."""

    @abstractmethod
    def load_index(self) -> bytes | None:
        """The last index snapshot, or None when none was saved."""

    @abstractmethod
    def describe(self) -> str:
        """Where the state lives, without credentials: "memory" or a Redis URL."""

    def close(self) -> None:
        """Release connections; the state itself stays."""


class MemoryStore(StateStore):
    """State in this process only: a restart forgets everything (said so in logs and stats)."""

    def __init__(self) -> None:
        self._nodes: dict[str, bytes] = {}
        self._counters: dict[str, dict[str, int]] = {}
        self._index: bytes | None = None

    def save_node(self, node: str, record: bytes) -> None:
        self._nodes[node] = record

    def load_nodes(self) -> dict[str, bytes]:
        return dict(self._nodes)

    def add_counters(self, deltas: CounterDeltas) -> None:
        for scope, fields in deltas.items():
            mine = self._counters.setdefault(scope, {})
            for name, delta in fields.items():
                mine[name] = mine.get(name, 0) + delta

    def load_counters(self) -> dict[str, dict[str, int]]:
        return {scope: dict(fields) for scope, fields in self._counters.items()}

    def save_index(self, blob: bytes) -> None:
        self._index = blob

    def load_index(self) -> bytes | None:
        return self._index

    def describe(self) -> str:
        return "memory"


class RedisStore(StateStore):
    """State in Redis under `prefix`: a hash of node records, one hash per counter scope, the set of
    scopes, and one string for the index snapshot."""

    def __init__(self, url: str, prefix: str = "radixmesh:", socket_timeout_s: float = 2.0) -> None:
        self._url = url
        self._prefix = prefix
        self._redis = redis.Redis.from_url(url, socket_timeout=socket_timeout_s)
        self._redis.ping()  # fail at startup, not on the first heartbeat

    def save_node(self, node: str, record: bytes) -> None:
        self._redis.hset(self._key("nodes"), node, record)

    def load_nodes(self) -> dict[str, bytes]:
        raw: dict[bytes, bytes] = self._redis.hgetall(self._key("nodes"))  # type: ignore[assignment]
        return {k.decode(): v for k, v in raw.items()}

    def add_counters(self, deltas: CounterDeltas) -> None:
        pipe = self._redis.pipeline(transaction=True)
        for scope, fields in deltas.items():
            pipe.sadd(self._key("scopes"), scope)
            for name, delta in fields.items():
                if delta:
                    pipe.hincrby(self._key(f"counters:{scope}"), name, delta)
        pipe.execute()

    def load_counters(self) -> dict[str, dict[str, int]]:
        scopes: set[bytes] = self._redis.smembers(self._key("scopes"))  # type: ignore[assignment]
        out = {}
        for raw_scope in scopes:
            scope = raw_scope.decode()
            fields: dict[bytes, bytes] = self._redis.hgetall(self._key(f"counters:{scope}"))  # type: ignore[assignment]
            out[scope] = {k.decode(): int(v) for k, v in fields.items()}
        return out

    def save_index(self, blob: bytes) -> None:
        self._redis.set(self._key("index"), blob)

    def load_index(self) -> bytes | None:
        blob: bytes | None = self._redis.get(self._key("index"))  # type: ignore[assignment]
        return blob

    def describe(self) -> str:
        parts = urlsplit(self._url)
        host = parts.hostname or ""
        netloc = f"{host}:{parts.port}" if parts.port else host
        return urlunsplit((parts.scheme, netloc, parts.path, "", ""))

    def close(self) -> None:
        self._redis.close()

    def _key(self, name: str) -> str:
        return f"{self._prefix}{name}"


def open_store(spec: str) -> StateStore:
    """`memory` or a `redis://` / `rediss://` / `unix://` URL; ValueError for anything else."""
    if spec == "memory":
        logger.warning("state store is in-process memory: a restart forgets membership and counters")
        return MemoryStore()
    if urlsplit(spec).scheme in ("redis", "rediss", "unix"):
        return RedisStore(spec)
    raise ValueError(f"state must be 'memory' or a redis:// URL, got {spec!r}")
