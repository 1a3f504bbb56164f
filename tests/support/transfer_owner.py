"""The other side of the transfer tests: an owner node (or a requester) in its own process.

`run_owner` builds a seeded pool, cache and KV tensor, serves them with a real TransferServer on
127.0.0.1 and answers commands over a multiprocessing pipe; its first message ("ready", port) is the
readiness signal. Faults are injected the way a broken or malicious peer behaves, on the owner's real
send path (after its checksums and MACs were computed).
`TransferActor` is an owner in a Ray worker for the Ray transport's tests and `bench/transfer.py`; in
production the agent actor itself serves pulls (`NodeAgent.serve_pull`).
"""

import asyncio
import dataclasses
import hashlib
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import ray
import torch

from radixmesh.common.block_pool.block_pool import BlockPool
from radixmesh.common.prefix_cache.prefix_cache import PrefixCache
from radixmesh.common.secret import ClusterSecret
from radixmesh.node_agent.transfer.handshake import NodeIdentity, ReplayGuard, Session
from radixmesh.node_agent.transfer.protocol import ChunkTrailer, PullRequest
from radixmesh.node_agent.transfer.pull_source import OpenPull, TransferSource
from radixmesh.node_agent.transfer.ray_transport import serve_pull
from radixmesh.proto.block_hash import BlockHash, hash_blocks
from radixmesh.proto.events import Tier
from radixmesh.proto.ids import BlockId, NodeId
from radixmesh.proto.kv_layout import KVLayout

LAYOUT = KVLayout("tiny-seed0", num_layers=2, num_kv_heads=2, head_dim=8, dtype="float32", block_size=4)
SECRET = ClusterSecret(bytes(range(32)))
OWNER = NodeId("owner")
REQUESTER = NodeId("requester")
SESSION = Session(REQUESTER, b"session-key-of-the-unit-tests-32")
"""What source.open gets in tests that drive a TransferSource without a handshake."""


@dataclass(frozen=True, slots=True)
class OwnerSpec:
    num_blocks: int = 64
    cached: int = 40
    """The owner caches the first `cached` blocks of `sequence_hashes(seed)`."""
    seed: int = 0
    send_timeout_s: float = 5.0
    handshake_timeout_s: float = 5.0
    max_connections: int = 256
    impostor: bool = False
    """Serve with another cluster's secret: a host that took over the owner's address."""
    stage_to_host: bool = False
    """Send host copies of every chunk (MemoryPath.CUDA_STAGED's owner side)."""


def sequence_hashes(n: int, seed: int = 0) -> list[BlockHash]:
    tokens = np.random.default_rng(seed).integers(0, 32000, size=n * LAYOUT.block_size)
    return hash_blocks(tokens, LAYOUT.block_size)


def kv_digest(kv: torch.Tensor, blocks: list[BlockId]) -> str:
    """Digest of the bytes of `blocks` in order: equal digests mean bitwise-equal KV."""
    h = hashlib.blake2b(digest_size=16)
    for b in blocks:
        h.update(kv[b].contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


class FaultySource(TransferSource):
    """A TransferSource whose next pull can be made to misbehave: "corrupt" flips a payload byte of
    chunk 1 after its checksum was taken; "stall" reports over the pipe after chunk 1 and then blocks
    the whole process (as a hung or dying peer does) until it is killed. A malicious owner: "short"
    sends chunk 1 one block short (its trailer still announces the whole chunk), "reorder" sends
    chunk 2 (trailer and payload) before chunk 1, "swap" sends chunk 2's payload and checksum as
    chunk 1, "huge_chunk_blocks" announces chunks of 2^31 blocks."""

    fault: str | None = None
    pipe: Connection | None = None

    def open(self, request: PullRequest, session: Session) -> OpenPull:
        pull = super().open(request, session)
        fault, self.fault = self.fault, None
        if fault is None:
            return pull
        if fault == "huge_chunk_blocks":
            pull.header = dataclasses.replace(pull.header, chunk_blocks=1 << 31)
            return pull
        return _FaultyPull(self, pull, fault)


class _FaultyPull(OpenPull):
    def __init__(self, source: FaultySource, pull: OpenPull, fault: str):
        # Takes over the pins of `pull` (which is dropped unclosed): one owner of the pins.
        super().__init__(source, pull.header, pull.blocks, pull._checksum.name if pull._checksum else "none",
                         pull._mac_key)
        self._fault = fault
        self._pipe = source.pipe

    def chunks(self) -> Iterator[tuple[ChunkTrailer, torch.Tensor]]:
        chunks = list(super().chunks())
        if self._fault in ("reorder", "swap"):
            (t1, p1), (t2, p2) = chunks[1], chunks[2]
            if self._fault == "reorder":
                chunks[1], chunks[2] = (t2, p2), (t1, p1)
            else:
                chunks[1] = (dataclasses.replace(t2, index=1), p2)
        for trailer, payload in chunks:
            if trailer.index == 1 and self._fault == "short":
                payload = payload[:-1]
            if trailer.index == 1 and self._fault == "corrupt":
                payload = payload.clone()
                payload.reshape(-1).view(torch.uint8)[7] ^= 0x40
            yield trailer, payload
            if trailer.index == 1 and self._fault == "stall":
                assert self._pipe is not None
                self._pipe.send("stalled")
                self._pipe.recv()  # blocks the event loop: the owner hangs mid-transfer


def build_source(spec: OwnerSpec) -> FaultySource:
    """Pool, cache and KV holding the first `spec.cached` blocks of the seeded sequence.

    Blocks are placed out of order in the first half (the owner must gather) and in one run in the
    second half (sent as a view of the cache).
    """
    pool = BlockPool(spec.num_blocks, tier=Tier.HOST, block_bytes=LAYOUT.block_bytes)
    cache = PrefixCache(pool)
    kv = LAYOUT.new_cache(spec.num_blocks)
    hashes = sequence_hashes(spec.cached, spec.seed)
    ids = pool.allocate(spec.cached)
    half = spec.cached // 2
    order = [ids[i] for i in np.random.default_rng(spec.seed + 1).permutation(half)] + ids[half:]
    gen = torch.Generator().manual_seed(spec.seed)
    for b in order:
        kv[b] = torch.randn(LAYOUT.block_shape, generator=gen)
    cache.insert(hashes, order)
    cache.release(order)
    return FaultySource(cache, kv, LAYOUT, stage_to_host=spec.stage_to_host)


def run_owner(conn: Connection, spec: OwnerSpec) -> None:
    """Process entry: serve until told "stop". Commands: ("state",) ("fault", name) ("digest", n)
    ("cpu",): the process's CPU seconds so far (time.process_time)."""
    asyncio.run(_serve(conn, spec))


async def _serve(conn: Connection, spec: OwnerSpec) -> None:
    from radixmesh.node_agent.transfer.server import TransferServer

    source = build_source(spec)
    source.pipe = conn
    secret = ClusterSecret(bytes(32)) if spec.impostor else SECRET
    server = TransferServer(source, "127.0.0.1", 0, secret=secret, node_id=OWNER, send_timeout_s=spec.send_timeout_s,
                            handshake_timeout_s=spec.handshake_timeout_s, max_connections=spec.max_connections,
                            loopback=True)
    conn.send(("ready", await server.start()))
    loop = asyncio.get_running_loop()
    while True:
        cmd: tuple[Any, ...] = await loop.run_in_executor(None, conn.recv)
        if cmd[0] == "stop":
            await server.stop()
            conn.send("stopped")
            return
        if cmd[0] == "state":
            await server.wait_idle()
            source.check_invariants()
            conn.send({"pinned": source.pinned_blocks, "in_use": source.cache.pool.num_in_use,
                       "failed": server.pulls_failed, "served": server.pulls_served,
                       "refused": server.refused_connections})
        elif cmd[0] == "fault":
            source.fault = cmd[1]
            conn.send("ok")
        elif cmd[0] == "cpu":
            conn.send(time.process_time())
        elif cmd[0] == "digest":
            blocks = source.cache.match(sequence_hashes(cmd[1], spec.seed))
            conn.send(kv_digest(source.kv, blocks))
            source.cache.release(blocks)


def run_vanishing_requester(conn: Connection, port: int, n: int) -> None:
    """Process entry: ask the owner for `n` blocks, say "asked" after the header, then hang (to be
    killed) without receiving a byte of payload."""
    asyncio.run(_vanish(conn, port, n))


async def _vanish(conn: Connection, port: int, n: int) -> None:
    from radixmesh.node_agent.transfer.transport import Peer
    from radixmesh.node_agent.transfer.ucx_transport import UcxTransport

    channel = await UcxTransport(NodeIdentity(SECRET, REQUESTER), loopback=True).connect(
        Peer(OWNER, "127.0.0.1", port))
    request = PullRequest(1, LAYOUT.fingerprint(), tuple(sequence_hashes(n)), n, 2 * LAYOUT.block_bytes, "crc32")
    header = await channel.request(request)
    conn.send(("asked", header.found))
    await asyncio.get_running_loop().run_in_executor(None, conn.recv)


def transfer_actor_name(node: NodeId) -> str:
    """The Ray actor name of a test owner (peers reach it as Peer(node, actor_name=...))."""
    return f"radixmesh-transfer-{node}"


class TransferActor:
    """Serves pulls out of the TransferSource that `make_source()` builds in the actor's process.

    Nothing survives a restart: the source (pool, cache, KV) is rebuilt empty-handed by the factory,
    and requesters simply miss. `pull` is safe to call concurrently; `state` is read-only.
    """

    def __init__(self, make_source: Callable[[], TransferSource], node: NodeId):
        self.source = make_source()
        self._identity = NodeIdentity(SECRET, node)
        self._guard = ReplayGuard()
        self._streams = 0
        self._ended = asyncio.Condition()

    async def pull(self, request: bytes) -> AsyncIterator[Any]:
        """serve_pull's stream of one pull."""
        self._streams += 1
        try:
            async for item in serve_pull(self.source, request, self._identity, self._guard):
                yield item
        finally:
            # A requester that gave up mid-stream is seen by Ray later than it returns: `state`
            # waits for this, not for a guessed delay.
            async with self._ended:
                self._streams -= 1
                self._ended.notify_all()

    async def fault(self, name: str) -> None:
        """Make the next pull misbehave (FaultySource's faults)."""
        assert isinstance(self.source, FaultySource)
        self.source.fault = name

    async def state(self) -> dict[str, int]:
        """Pins held and blocks in use once every pull stream has ended, after checking the source's
        invariants."""
        async with self._ended:
            await self._ended.wait_for(lambda: self._streams == 0)
        self.source.check_invariants()
        return {"pinned": self.source.pinned_blocks, "in_use": self.source.cache.pool.num_in_use}


def make_transfer_actor(node: NodeId, make_source: Callable[[], TransferSource], **options: Any) -> Any:
    """Start `node`'s TransferActor under transfer_actor_name(node) and return once it answers;
    `options` go to `.options()`. A test's first pull must meet a started owner: on a busy host the
    actor's start (its torch import) outlasts a pull's timeout, which would read as TIMEOUT."""
    cls = ray.remote(TransferActor)
    actor = cls.options(name=transfer_actor_name(node), max_concurrency=16, **options).remote(make_source, node)
    ray.get(actor.state.remote(), timeout=120)
    return actor
