"""A pull is bound to its handshake (transfer.binding): a man in the middle of the control connection
cannot rewrite what is asked or answered, and nobody without the session key can aim a payload
message at a requester's pull, even with the chunk MAC off and the pull ids predictable.

The attacks run against the real client and owner over UCX on 127.0.0.1: the owner in its own
process, the requester here, a relay on this loop that rewrites control frames in flight, and an
injector process with a UCX worker of its own."""

import asyncio
import multiprocessing as mp
import struct
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection

import numpy as np
import pytest

from radixmesh.node_agent.transfer import client as client_module
from radixmesh.node_agent.transfer import ucx_progress
from radixmesh.node_agent.transfer.binding import BindingError, SessionBinding, open_header, seal_header
from radixmesh.node_agent.transfer.client import PullOutcome
from radixmesh.node_agent.transfer.handshake import Session
from radixmesh.node_agent.transfer.protocol import Kind, payload_tag
from radixmesh.node_agent.transfer.transport import Peer
from radixmesh.node_agent.transfer.ucx_transport import import_ucxx
from tests.node_agent.transfer import test_transfer_ucx
from tests.node_agent.transfer.test_transfer_ucx import CHUNK, Owner, Requester, assert_owner_clean
from tests.support.transfer_owner import LAYOUT, OWNER, kv_digest, sequence_hashes

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
loop = test_transfer_ucx.loop  # one event loop and one owner process for the module
owner = test_transfer_ucx.owner

CTX = mp.get_context("spawn")
SESSION = Session(OWNER, bytes(range(32)))


# --- the binding itself --------------------------------------------------------------------------
def pair() -> tuple[SessionBinding, SessionBinding]:
    """The requester's and the owner's end of one session."""
    return SessionBinding(SESSION), SessionBinding(SESSION)


def test_both_ends_derive_the_same_pull_and_every_pull_its_own_keys() -> None:
    requester, owner_end = pair()
    pulls = []
    for body in (b"request-0", b"request-0", b"request-1"):  # the same request twice: two pulls
        sealed, mine = requester.seal_request(body)
        opened, theirs = owner_end.open_request(sealed)
        assert (opened, mine) == (body, theirs)
        pulls.append(mine)
    assert len({p.digest for p in pulls}) == len({p.chunk_key for p in pulls}) == len({p.tag_base for p in pulls}) == 3
    assert all(0 <= p.tag_base < 1 << 44 for p in pulls)


@pytest.mark.parametrize("flip", [0, 5, -1])  # in the request's head, its hash list, its MAC
def test_an_altered_request_does_not_open(flip: int) -> None:
    requester, owner_end = pair()
    sealed = bytearray(requester.seal_request(b"pull 7: hashes of prefix B, chunk 3 blocks")[0])
    sealed[flip] ^= 1
    with pytest.raises(BindingError, match="request is not bound"):
        owner_end.open_request(bytes(sealed))


def test_a_replayed_request_does_not_open() -> None:
    requester, owner_end = pair()
    sealed, _ = requester.seal_request(b"pull 1")
    owner_end.open_request(sealed)
    with pytest.raises(BindingError, match="replayed"):
        owner_end.open_request(sealed)  # the owner expects the session's second request now


def test_another_sessions_request_and_an_altered_address_do_not_open() -> None:
    sealed, _ = SessionBinding(Session(OWNER, bytes(32))).seal_request(b"pull 1")
    with pytest.raises(BindingError):
        SessionBinding(SESSION).open_request(sealed)
    address = bytearray(SessionBinding(SESSION).seal_address(b"ucx worker address of the requester"))
    assert SessionBinding(SESSION).open_address(bytes(address)) == b"ucx worker address of the requester"
    address[3] ^= 1
    with pytest.raises(BindingError, match="address is not bound"):
        SessionBinding(SESSION).open_address(bytes(address))


def test_a_header_answers_its_own_request_only() -> None:
    requester, _ = pair()
    first, second = (requester.seal_request(b"same request")[1] for _ in range(2))
    header = b"status OK, 12 blocks"
    assert open_header(first, seal_header(first, header)) == header
    for forged in (seal_header(second, header), seal_header(None, header), b""):
        with pytest.raises(BindingError, match="header is not bound"):
            open_header(first, forged)


def test_the_pulls_source_session_carries_the_pull_key_not_the_session_key() -> None:
    _, pull = SessionBinding(SESSION).seal_request(b"r")
    assert pull.chunk_session == Session(OWNER, pull.chunk_key) and pull.chunk_key != SESSION.key


# --- a man in the middle of the control connection -------------------------------------------------
_FRAME = struct.Struct("<IB")
_REQUEST_HEAD = struct.Struct("<QIIQBBB")  # pull_id, n_hashes, max_blocks, chunk_bytes, mac, len(fp), len(checksum)
_HEADER_HEAD = struct.Struct("<QBIQIBH")  # pull_id, status, found, block_bytes, chunk_blocks, len(fp), len(msg)
Rewrite = Callable[[Kind, bytes], bytes]


class Relay:
    """A TCP relay to the owner that passes every control frame through `rewrite` (both directions);
    `rewritten` counts the frames it changed. What a host on the path can do without any key."""

    def __init__(self, owner_port: int, rewrite: Rewrite):
        self._owner_port = owner_port
        self._rewrite = rewrite
        self.rewritten = 0
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._owner_port)
        await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer), return_exceptions=True)
        for w in (writer, up_writer):
            w.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                n, kind = _FRAME.unpack(await reader.readexactly(_FRAME.size))
                body = await reader.readexactly(n)
                changed = self._rewrite(Kind(kind), body)
                self.rewritten += changed != body
                writer.write(_FRAME.pack(len(changed), kind) + changed)
                await writer.drain()
        finally:
            writer.close()  # one side hung up: so does the other


def swap_hashes(to: list) -> Rewrite:
    """Replace the hash list of every REQUEST by `to` (as many hashes as it asked for)."""
    def rewrite(kind: Kind, body: bytes) -> bytes:
        if kind is not Kind.REQUEST:
            return body
        _, n, _, _, _, lf, lc = _REQUEST_HEAD.unpack_from(body)
        start = _REQUEST_HEAD.size + lf + lc
        return body[:start] + b"".join(to[:n]) + body[start + 16 * n :]
    return rewrite


def cut_found(to: int) -> Rewrite:
    """Make every HEADER announce `to` blocks (a truncation: the requester would file fewer)."""
    def rewrite(kind: Kind, body: bytes) -> bytes:
        if kind is not Kind.HEADER:
            return body
        head = list(_HEADER_HEAD.unpack_from(body))
        head[2] = min(head[2], to)
        return _HEADER_HEAD.pack(*head) + body[_HEADER_HEAD.size :]
    return rewrite


@pytest.mark.parametrize(("attack", "asked", "owner_refuses"), [
    # The requester asks for prefix B, which the owner does not hold; the relay asks for prefix A.
    (swap_hashes(sequence_hashes(12)), sequence_hashes(12, seed=1), True),
    # The request is intact (the owner serves it); its answer is cut short on the way back.
    (cut_found(6), sequence_hashes(12), False),
])
def test_a_man_in_the_middle_cannot_change_what_is_asked_or_answered(
        loop: asyncio.AbstractEventLoop, owner: Owner, attack: Rewrite, asked: list, owner_refuses: bool) -> None:
    relay = Relay(owner.port, attack)
    loop.run_until_complete(relay.start())
    try:
        served = owner.call("state")["served"]
        req = Requester(loop, mac=True)  # every chunk MAC'd, as in the audit's proof of concept
        result = req.pull(Peer(OWNER, "127.0.0.1", relay.port), asked)
        assert relay.rewritten == 1  # the attack took place
        assert (result.outcome, result.blocks) == (PullOutcome.UNAUTHENTICATED, 0)
        assert len(req.cache) == 0 and req.cache.take_events() == []  # nothing filed under any hash
        req.finish(result)
        state = owner.call("state")
        assert state["pinned"] == 0 and (state["served"] == served or not owner_refuses)
    finally:
        loop.run_until_complete(relay.stop())
    honest = Requester(loop, mac=True)
    result = honest.pull(owner.peer(), sequence_hashes(12))
    assert (result.outcome, result.blocks) == (PullOutcome.OK, 12)
    assert kv_digest(honest.kv, result.block_ids) == owner.call("digest", 12)
    honest.finish(result)
    assert_owner_clean(owner)


# --- injection into a requester's worker -----------------------------------------------------------
def run_injector(conn: Connection) -> None:
    """Process entry: on ("inject", worker address, tags, nbytes) send one message of `nbytes` 0xAA
    bytes per tag to that worker and answer "sent"; then wait to be stopped."""
    asyncio.run(_inject(conn))


async def _inject(conn: Connection) -> None:
    ucxx = import_ucxx(loopback=True)
    loop = asyncio.get_running_loop()
    _, address, tags, nbytes = await loop.run_in_executor(None, conn.recv)
    ep = await ucxx.create_endpoint_from_worker_address(ucxx.get_ucx_address_from_buffer(address))
    ucx_progress.nudge(ucxx)
    junk = np.full(nbytes, 0xAA, dtype=np.uint8)
    for tag in tags:
        await ucx_progress.post_send(ucxx, ep, junk, tag)
    conn.send("sent")
    await loop.run_in_executor(None, conn.recv)


@pytest.fixture
def injector() -> Iterator[Connection]:
    conn, child = CTX.Pipe()
    proc = CTX.Process(target=run_injector, args=(child,), daemon=True)
    proc.start()
    yield conn
    proc.kill()
    proc.join(10)


def test_nobody_without_the_session_key_can_inject_chunks(loop: asyncio.AbstractEventLoop, owner: Owner,
                                                          injector: Connection) -> None:
    """The attacker learned the requester's worker address and the last pull id (both travel in the
    clear); the chunk MAC and the checksum are off (the defaults)."""
    next_pull = next(client_module._PULL_IDS) + 1
    n = 12
    tags = [payload_tag(next_pull, i) for i in range(-(-n // (CHUNK // LAYOUT.block_bytes)))]

    async def inject() -> None:
        address = import_ucxx(loopback=True).get_worker_address().tobytes()
        injector.send(("inject", address, tags, CHUNK))
        # This loop keeps progressing our worker while the injector sends: its messages are queued here.
        assert await asyncio.get_running_loop().run_in_executor(None, injector.recv) == "sent"

    loop.run_until_complete(inject())
    req = Requester(loop, checksum="none")
    result = req.pull(owner.peer(), sequence_hashes(n))
    assert (result.outcome, result.blocks) == (PullOutcome.OK, n)
    assert kv_digest(req.kv, result.block_ids) == owner.call("digest", n)  # the owner's bytes, not 0xAA
    req.finish(result)
    assert_owner_clean(owner)



@pytest.mark.parametrize(("fault", "outcome", "kept"), [(None, PullOutcome.OK, 12),
                                                        ("corrupt", PullOutcome.CHECKSUM_MISMATCH, 3)])
def test_chunks_verified_on_a_worker_thread_keep_exactly_the_intact_prefix(
        loop: asyncio.AbstractEventLoop, owner: Owner, monkeypatch: pytest.MonkeyPatch, fault: str | None,
        outcome: PullOutcome, kept: int) -> None:
    monkeypatch.setattr(client_module, "OFF_LOOP_BYTES", 1)  # every chunk is large enough here
    if fault:
        assert owner.call("fault", fault) == "ok"
    req = Requester(loop, checksum="none", mac=True)  # the MAC alone tells a corrupted chunk
    result = req.pull(owner.peer(), sequence_hashes(12))
    assert (result.outcome, result.blocks) == (outcome, kept)
    assert kv_digest(req.kv, result.block_ids) == owner.call("digest", kept)
    req.finish(result)
    assert_owner_clean(owner)
