"""KVEventSubscriber: follows one engine's ZMQ event stream in sequence order (its sockets; the
schema and framing are proto/vllm_kv_events.py).

A batch one past the last applied is applied; a restart (a lower number), a first batch or a gap is
replayed from the engine's replay socket where it reaches back, else every holding is forgotten
(`on_gap`) and the latest contiguous run applied, so a missed removal never stays in the index.
Frames are bounded (`max_message_bytes`), a source is trusted only on a private ipc:// path
(`check_source`), and a failure restarts the following (SupervisedTask). The rules and why:
docs/routing.md#following-an-engines-kv-events.
"""

import asyncio
import contextlib
import logging
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import zmq
import zmq.asyncio

from radixmesh.cluster.fleet.supervised_task import SupervisedTask
from radixmesh.common.kv_events_curve import connect_curve
from radixmesh.common.secret import ClusterSecret
from radixmesh.proto.vllm_kv_events import (
    END_OF_REPLAY,
    EventDecodeError,
    VllmEventBatch,
    decode_batch,
    decode_pub,
    decode_replay,
    replay_request,
)

logger = logging.getLogger(__name__)


MAX_MESSAGE_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class SubscriberConfig:
    endpoint: str
    """The engine's PUB address, e.g. tcp://10.0.0.5:5557 (vLLM's `--kv-events-config` endpoint)."""
    replay_endpoint: str | None = None
    """The engine's ROUTER replay address; None: gaps are repaired by forgetting, never by replay."""
    topic: str = ""
    """Topic prefix to subscribe to ("" takes every topic; vLLM's default topic is "")."""
    replay_timeout_s: float = 2.0
    """How long one replay may take before it counts as failed."""
    max_message_bytes: int = MAX_MESSAGE_BYTES
    """Longest frame read from the engine (a batch payload); a longer one drops the connection. vLLM
    publishes a batch per engine step, whose tokens stay under max_num_batched_tokens: 1 MiB holds
    over 100k token ids (measured: 420 KiB for 131k, decoded in 22 ms)."""
    curve: ClusterSecret | None = field(default=None, repr=False)
    """Connect as a CURVE client of a publisher of this cluster secret (a radixmesh agent's tcp
    sockets: common.kv_events_curve); None: plain sockets, as vLLM publishes."""

    def __post_init__(self) -> None:
        for name, value in (("endpoint", self.endpoint), ("replay_endpoint", self.replay_endpoint or "tcp://x")):
            if "://" not in value:
                raise ValueError(f"{name} must be a ZMQ address such as tcp://host:5557, got {value!r}")
        if not self.replay_timeout_s > 0:
            raise ValueError(f"replay_timeout_s must be > 0, got {self.replay_timeout_s}")
        if self.max_message_bytes < 1024:
            raise ValueError(f"max_message_bytes must be >= 1024, got {self.max_message_bytes}")

    @property
    def authenticated(self) -> bool:
        """Whether only a trusted process can publish here: a CURVE publisher (it proves it holds the
        cluster secret's server key), or an ipc path (check_source vets its folder)."""
        return self.curve is not None or all(e is None or e.startswith("ipc://")
                                             for e in (self.endpoint, self.replay_endpoint))


def check_source(endpoint: str) -> None:
    """ValueError unless whoever bound the ipc `endpoint` must be this user or root: its directory is
    theirs and nobody else may create files in it (tcp: nothing to check, see the module docstring)."""
    scheme, _, path = endpoint.partition("://")
    if scheme != "ipc":
        return
    if path.startswith("@"):
        raise ValueError(f"KV events source {endpoint!r} is an abstract socket: any local process may bind it; "
                         "give an ipc path in a directory only the engine's user may write")
    folder = Path(path).parent
    try:
        st = os.stat(folder)
    except OSError as e:
        raise ValueError(f"KV events source {endpoint!r}: its directory {str(folder)!r} cannot be used: {e}") from None
    if st.st_uid not in (0, os.geteuid()) or stat.S_IMODE(st.st_mode) & 0o022:
        raise ValueError(f"KV events source {endpoint!r}: its directory {str(folder)!r} must be this user's (or "
                         f"root's) and writable by nobody else (mode {stat.S_IMODE(st.st_mode):o}, owner uid "
                         f"{st.st_uid}): another user could otherwise bind the socket and feed the index")


@dataclass(slots=True)
class SubscriberStats:
    batches: int = 0
    gaps: int = 0
    restarts: int = 0
    replays: int = 0
    replayed_batches: int = 0
    forgets: int = 0
    bad_payloads: int = 0
    malformed_messages: int = 0
    dropped_connections: int = 0
    """Connections to the engine's PUB that ended (a frame past max_message_bytes, the engine gone)."""


class KVEventSubscriber:
    """Calls `on_batch` for each batch in sequence order and `on_gap` where holdings must be forgotten.

    Both callbacks run on the event loop that called `start`, and should not raise: one that does
    costs the engine's holdings (the following task restarts, see the module docstring).
    """

    def __init__(self, config: SubscriberConfig, on_batch: Callable[[VllmEventBatch], None],
                 on_gap: Callable[[], None], *, context: zmq.asyncio.Context | None = None) -> None:
        self.config = config
        self._on_batch = on_batch
        self._on_gap = on_gap
        self._ctx = context or zmq.asyncio.Context.instance()
        self._sub: zmq.asyncio.Socket | None = None
        self._watch: asyncio.Task[None] | None = None
        self.task = SupervisedTask(f"kv-events {config.endpoint}", self._run, self._restart)
        """Follows the stream; its `restarts` count the failures it survived."""
        self.last_seq: int | None = None
        """The last batch applied (None before the first)."""
        self.stats = SubscriberStats()

    async def start(self) -> None:
        """Connect; ValueError when an ipc source's directory lets others bind it (check_source)."""
        for endpoint in (self.config.endpoint, self.config.replay_endpoint):
            if endpoint is not None:
                check_source(endpoint)
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.MAXMSGSIZE, self.config.max_message_bytes)
        sub.setsockopt(zmq.SUBSCRIBE, self.config.topic.encode())
        if self.config.curve is not None:
            connect_curve(sub, self.config.curve)
        monitor = sub.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        sub.connect(self.config.endpoint)
        self._sub = sub
        self.task.start()
        self._watch = asyncio.create_task(self._reconnect_when_dropped(sub, monitor),
                                          name=f"kv-events-connection {self.config.endpoint}")

    async def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            await asyncio.gather(self._watch, return_exceptions=True)
            self._watch = None
        await self.task.stop()
        if self._sub is not None:
            self._sub.disable_monitor()
            self._sub.close(linger=0)
            self._sub = None

    async def _reconnect_when_dropped(self, sub: zmq.asyncio.Socket, monitor: zmq.asyncio.Socket) -> None:
        """Connect again whenever the connection ends: libzmq reconnects after a network error but not
        after a protocol error (a frame past ZMQ_MAXMSGSIZE), which would end the ingest for good."""
        try:
            while True:
                await monitor.recv_multipart()  # only EVENT_DISCONNECTED is monitored
                self.stats.dropped_connections += 1
                logger.warning("%s: the connection dropped (the engine went away, or sent a frame over %d "
                               "bytes): connecting again", self.config.endpoint, self.config.max_message_bytes)
                with contextlib.suppress(zmq.ZMQError):  # already gone after a protocol error
                    sub.disconnect(self.config.endpoint)
                sub.connect(self.config.endpoint)
        finally:
            monitor.close(linger=0)

    async def _run(self) -> None:
        assert self._sub is not None
        while True:
            try:
                seq, payload = decode_pub(await self._sub.recv_multipart())
            except EventDecodeError as e:
                logger.warning("%s: %s: dropped", self.config.endpoint, e)
                self.stats.malformed_messages += 1
                continue
            await self.receive(seq, payload)

    def _restart(self, error: Exception) -> None:
        """The following task failed mid-batch: what it applied is in doubt, so forget it all and take
        the next batch as a first one (with a replay socket: everything the engine still buffers)."""
        self.last_seq = None
        self._forget()

    async def receive(self, seq: int, payload: bytes) -> None:
        """One published batch (the order rules in the module docstring)."""
        last = self.last_seq
        if last is not None and seq == last + 1:
            self._apply(seq, payload)
            return
        if last is not None and seq <= last:
            logger.info("%s: batch %d after %d: the engine restarted", self.config.endpoint, seq, last)
            self.stats.restarts += 1
            self._forget()
            self.last_seq = last = None
        elif last is not None:
            logger.info("%s: batch %d after %d: %d batch(es) missed", self.config.endpoint, seq, last,
                        seq - last - 1)
            self.stats.gaps += 1
        start = last + 1 if last is not None else 0
        run = await self._replay(start) if self.config.replay_endpoint is not None else []
        run = [(s, p) for s, p in run if start <= s < seq] + [(seq, payload)]
        # Keep the contiguous run that ends with `seq`; it reaches back to `start` when nothing is lost.
        first = len(run) - 1
        while first > 0 and run[first - 1][0] == run[first][0] - 1:
            first -= 1
        if last is not None and run[first][0] != start:
            self._forget()
        for s, p in run[first:]:
            self._apply(s, p)

    def _apply(self, seq: int, payload: bytes) -> None:
        self.last_seq = seq
        try:
            batch = decode_batch(payload)
        except EventDecodeError as e:
            logger.warning("%s: batch %d does not decode (%s): handled as lost", self.config.endpoint, seq, e)
            self.stats.bad_payloads += 1
            self._forget()
            return
        self.stats.batches += 1
        self._on_batch(batch)

    def _forget(self) -> None:
        self.stats.forgets += 1
        self._on_gap()

    async def _replay(self, start: int) -> list[tuple[int, bytes]]:
        """Batches from `start` on, as the engine's replay socket sends them (in order); [] when it
        does not answer in time or answers garbage."""
        assert self.config.replay_endpoint is not None
        self.stats.replays += 1
        dealer = self._ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.MAXMSGSIZE, self.config.max_message_bytes)
        if self.config.curve is not None:
            connect_curve(dealer, self.config.curve)
        out: list[tuple[int, bytes]] = []
        try:
            dealer.connect(self.config.replay_endpoint)
            await dealer.send_multipart(replay_request(start))
            async with asyncio.timeout(self.config.replay_timeout_s):
                while True:
                    s, payload = decode_replay(await dealer.recv_multipart())
                    if s == END_OF_REPLAY:
                        break
                    out.append((s, payload))
        except (TimeoutError, EventDecodeError) as e:
            logger.warning("%s: replay from %d failed (%s)", self.config.replay_endpoint, start,
                           type(e).__name__ if isinstance(e, TimeoutError) else e)
            return []
        finally:
            dealer.close(linger=0)
        self.stats.replayed_batches += len(out)
        return out
