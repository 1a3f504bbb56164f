"""ZmqKVEventPublisher: the agent's cache events, published as vLLM publishes its own
(proto/vllm_kv_events.py holds the schema and framing; this module its sockets and translation).

The agent hands over, through `offer`, every batch it drains from its tiers' prefix caches (the
same batches the metadata publisher sends); here, on the event loop, each becomes one numbered
KVEventBatch, kept for the replay socket. Token ids and the cache salt go out only with `token_ids`
(off by default: they are the prompts). The translation, the token lag, the numbering and the
bounds on peers: docs/routing.md#the-agents-kv-events-in-vllms-format.
"""

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence

import zmq
import zmq.asyncio

from radixmesh.common.kv_events_curve import ClientKeyCheck, serve_curve
from radixmesh.common.secret import ClusterSecret
from radixmesh.node_agent.kv_events.endpoint import check_ipc_directory, replay_endpoint
from radixmesh.node_agent.kv_events.token_book import BookEntry, Ticket, TokenBook
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.events import AllCleared, BlockRemoved, BlockStored, CacheEvent
from radixmesh.proto.vllm_kv_events import (
    FULL_ATTENTION,
    MEDIUM,
    REPLAY_END,
    SEQ_BYTES,
    EventDecodeError,
    VllmAllBlocksCleared,
    VllmBlockRemoved,
    VllmBlockStored,
    VllmEvent,
    VllmEventBatch,
    decode_replay_request,
    encode_batch,
    pub_frames,
    replay_frames,
    wire_hash,
)

logger = logging.getLogger(__name__)

REPLAY_HWM = 256
MESSAGE_SLACK = 64
CURVE_MESSAGE_SLACK = 512
"""With CURVE, libzmq counts the handshake's INITIATE command (a few hundred bytes: measured, 256
refused every client and 512 admitted them) against ZMQ_MAXMSGSIZE too."""
"""Replay messages queued for one peer at most (a ROUTER drops the rest of a peer that does not read)."""


class ZmqKVEventPublisher:
    """Use: `await start()`; `offer` from any thread, `open` / `extend` / `close` each served request
    on the event loop; `await stop()`."""

    def __init__(self, endpoint: str, book: TokenBook, *, topic: str = "", buffer_steps: int = 10_000,
                 max_replay_bytes: int = 8 << 20, token_ids: bool = False, clock: Callable[[], float] = time.time,
                 secret: ClusterSecret | None = None) -> None:
        """`token_ids`: publish each stored block's tokens and its chain's cache salt (module docstring).
        `secret`: over tcp, both sockets are CURVE servers that admit only the secret's client key
        (common.kv_events_curve); an ipc endpoint is guarded by its directory's permissions instead."""
        if buffer_steps < 1 or max_replay_bytes < 1:
            raise ValueError(f"buffer_steps and max_replay_bytes must be >= 1, got {buffer_steps}, {max_replay_bytes}")
        self._max_replay_bytes = max_replay_bytes
        self._token_ids = token_ids
        self.book = book
        self.topic = topic
        self._endpoints = (endpoint, replay_endpoint(endpoint))
        self._clock = clock
        self._curve = secret if endpoint.startswith("tcp://") else None
        # A CURVE publisher has a context of its own: its ZAP handler answers for every socket of it.
        self._ctx = zmq.asyncio.Context() if self._curve is not None else zmq.asyncio.Context.instance()
        self._clients = ClientKeyCheck(self._ctx, self._curve) if self._curve is not None else None
        self._ring: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._pending: deque[tuple[list[CacheEvent], int]] = deque()
        """Offered batches not published yet, each with the book's stamp when it came."""
        self.published = 0
        """Batches published: the next one's seq."""
        self._wake = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pub: zmq.asyncio.Socket | None = None
        self._router: zmq.asyncio.Socket | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.endpoint = ""
        """The PUB socket's bound address (a tcp port 0 resolved); "" until started."""
        self.replay_endpoint = ""
        self.subscriptions = 0
        """Subscribe messages seen on the PUB side (and applied: prefixes of our topic)."""
        self.refused_subscriptions = 0
        """Subscriptions to anything but a prefix of our topic: never applied (they match nothing)."""
        self.left_out_blocks = 0
        """Stored blocks left out of the published events: their tokens never became known here."""

    async def start(self) -> None:
        """Bind both sockets; ValueError naming the address when one cannot be bound."""
        check_ipc_directory(self._endpoints[0])
        self._loop = asyncio.get_running_loop()
        pub, router = self._ctx.socket(zmq.XPUB), self._ctx.socket(zmq.ROUTER)
        for sock in (pub, router):
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.IPV6, 1)  # tcp://[::1]:port binds too
        pub.setsockopt(zmq.XPUB_VERBOSE, 1)
        pub.setsockopt(zmq.XPUB_MANUAL, 1)  # we apply the subscriptions: only prefixes of our topic
        # b"\x01" + a prefix of the topic, and b"" / an 8-byte seq; libzmq counts the ZMTP 3.1
        # SUBSCRIBE command's own bytes too (measured: a limit of 1 refused b"\x01"), hence the slack.
        slack = MESSAGE_SLACK if self._curve is None else CURVE_MESSAGE_SLACK
        pub.setsockopt(zmq.MAXMSGSIZE, slack + len(self.topic.encode()))
        router.setsockopt(zmq.MAXMSGSIZE, slack + SEQ_BYTES)
        router.setsockopt(zmq.SNDHWM, REPLAY_HWM)
        if self._curve is not None and self._clients is not None:
            self._clients.start()
            for sock in (pub, router):
                serve_curve(sock, self._curve)
        try:
            for sock, address, what in ((pub, self._endpoints[0], "PUB"), (router, self._endpoints[1], "replay")):
                try:
                    sock.bind(address)
                except zmq.ZMQError as e:
                    raise ValueError(f"cannot bind the KV events {what} socket to {address!r}: {e}") from None
        except BaseException:
            pub.close(linger=0)
            router.close(linger=0)
            raise
        self._pub, self._router = pub, router
        self.endpoint = pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self.replay_endpoint = router.getsockopt_string(zmq.LAST_ENDPOINT)
        self._tasks = [asyncio.create_task(fn(), name=f"kv-events-{fn.__name__}")
                       for fn in (self._publish, self._serve_replay, self._watch_subscriptions)]
        for task in self._tasks:
            task.add_done_callback(_log_failure)
        logger.info("KV events (vLLM format) on %s, replay on %s", self.endpoint, self.replay_endpoint)

    async def stop(self) -> None:
        """Stop publishing and close both sockets; batches not yet published are dropped. Idempotent."""
        self._loop = None
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        for sock in (self._pub, self._router):
            if sock is not None:
                sock.close(linger=0)
        self._pub = self._router = None
        if self._clients is not None and not self._ctx.closed:
            self._clients.stop()
            self._ctx.term()

    @property
    def refused_clients(self) -> int:
        """Subscribers and replay peers whose CURVE key was not the cluster's (0 without CURVE)."""
        return self._clients.refused if self._clients is not None else 0

    @property
    def waiting(self) -> int:
        """Batches offered and not published yet (waiting for tokens, or for the loop)."""
        return len(self._pending)

    # --- intake -------------------------------------------------------------------------------
    def offer(self, events: Sequence[CacheEvent]) -> None:
        """A drained batch of cache events, in order; callable from any thread (the engine's)."""
        loop = self._loop
        if events and loop is not None:
            loop.call_soon_threadsafe(self._enqueue, list(events))

    def open(self, tokens: Sequence[int], hashes: Sequence[BlockHash], tenant: str | None) -> Ticket:
        """A request to be served (TokenBook.open); on the event loop, before it is submitted."""
        return self.book.open(tokens, hashes, tenant)

    def extend(self, ticket: Ticket, tokens: Sequence[int]) -> None:
        """Tokens it generated (TokenBook.extend): batches waiting for them may go."""
        self.book.extend(ticket, tokens)
        self._wake.set()

    def close(self, ticket: Ticket) -> None:
        """It ended, however: batches waiting on it go with what the book knows."""
        self.book.close(ticket)
        self._wake.set()

    def _enqueue(self, events: list[CacheEvent]) -> None:
        self._pending.append((events, self.book.stamp()))
        self._wake.set()

    # --- the loops ----------------------------------------------------------------------------
    async def _publish(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                events, stamp = self._pending[0]
                out = self._translate(events, wait=not self.book.opened_before_are_closed(stamp))
                if out is None:
                    break
                self._pending.popleft()
                if out:
                    await self._send(out)

    async def _send(self, events: list[VllmEvent]) -> None:
        assert self._pub is not None
        seq, self.published = self.published, self.published + 1
        payload = encode_batch(VllmEventBatch(self._clock(), tuple(events), data_parallel_rank=0))
        self._ring.append((seq, payload))
        await self._pub.send_multipart(pub_frames(self.topic, seq, payload))

    async def _serve_replay(self) -> None:
        assert self._router is not None
        while True:
            client, *request = await self._router.recv_multipart()
            try:
                start = decode_replay_request(request)
            except EventDecodeError as e:
                logger.warning("KV events replay: %s: ignored", e)
                continue
            sent = 0
            for seq, payload in list(self._ring):
                if seq >= start:
                    if sent and sent + len(payload) > self._max_replay_bytes:
                        break  # the consumer asks again from the next seq it misses
                    sent += len(payload)
                    await self._router.send_multipart((client, *replay_frames(seq, payload)))
            await self._router.send_multipart((client, *REPLAY_END))

    async def _watch_subscriptions(self) -> None:
        assert self._pub is not None
        while True:
            message = await self._pub.recv()
            kind, prefix = message[:1], message[1:]
            if kind not in (b"\x00", b"\x01"):
                continue
            if not self.topic.encode().startswith(prefix):
                self.refused_subscriptions += kind == b"\x01"
                continue
            self._pub.setsockopt(zmq.SUBSCRIBE if kind == b"\x01" else zmq.UNSUBSCRIBE, prefix)
            self.subscriptions += kind == b"\x01"

    # --- translation --------------------------------------------------------------------------
    def _translate(self, events: list[CacheEvent], *, wait: bool) -> list[VllmEvent] | None:
        """The batch in vLLM's terms, the book's holdings updated; None (nothing changed) when it
        names a block whose tokens may still come and `wait` says to wait for them."""
        if wait and any(isinstance(e, BlockStored) and any(self.book.get(h) is None for h in e.hashes)
                        for e in events):
            return None
        out: list[VllmEvent] = []
        for e in events:
            if isinstance(e, BlockStored):
                out += self._stored(e)
                self.book.hold(e.hashes, e.tier)
            elif isinstance(e, BlockRemoved):
                out.append(VllmBlockRemoved(tuple(wire_hash(h) for h in e.hashes), MEDIUM[e.tier], 0))
                self.book.release(e.hashes, e.tier)
            else:
                assert isinstance(e, AllCleared)
                out.append(VllmAllBlocksCleared())
                self.book.release_all()
        return out

    def _stored(self, e: BlockStored) -> list[VllmBlockStored]:
        """One event per run of the book's chain (a run breaks where a block's parent is not the
        block before it, or where a block is unknown)."""
        runs: list[list[tuple[BlockHash, BookEntry]]] = []
        for h in e.hashes:
            entry = self.book.get(h)
            if entry is None:
                self.left_out_blocks += 1
                runs.append([])
            elif runs and runs[-1] and entry.parent == runs[-1][-1][0]:
                runs[-1].append((h, entry))
            else:
                runs.append([(h, entry)])
        return [self._run(run, e) for run in runs if run]

    def _run(self, run: list[tuple[BlockHash, BookEntry]], e: BlockStored) -> VllmBlockStored:
        first = run[0][1]
        salt = first.cache_salt if self._token_ids else None
        extra = ((salt,), *(None,) * (len(run) - 1)) if salt is not None else None
        return VllmBlockStored(
            block_hashes=tuple(wire_hash(h) for h, _ in run),
            parent_block_hash=wire_hash(first.parent) if first.parent is not None else None,
            token_ids=tuple(t for _, x in run for t in x.tokens) if self._token_ids else (),
            block_size=self.book.block_size, lora_id=None, medium=MEDIUM[e.tier], lora_name=None,
            extra_keys=extra, group_idx=0, kv_cache_spec_kind=FULL_ATTENTION)


def _log_failure(task: asyncio.Task[None]) -> None:
    """A loop that ended by raising: its socket is left unserved (logged, the agent serves on)."""
    if not task.cancelled() and task.exception() is not None:
        logger.error("KV events: %s failed", task.get_name(), exc_info=task.exception())


class NoKVEvents:
    """No KV events published (AgentConfig.kv_events_endpoint None): every call does nothing."""

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    def offer(self, events: Sequence[CacheEvent]) -> None:
        pass

    def open(self, tokens: Sequence[int], hashes: Sequence[BlockHash], tenant: str | None) -> Ticket:
        return Ticket(-1, [], [], tenant)

    def extend(self, ticket: Ticket, tokens: Sequence[int]) -> None:
        pass

    def close(self, ticket: Ticket) -> None:
        pass


KVEventsOut = ZmqKVEventPublisher | NoKVEvents
