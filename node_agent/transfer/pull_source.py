"""The owner's side of a pull, independent of the transport: validate, pin, gather, unpin.

Every transport authenticates the requester first (transfer.handshake) and drives it the same way::

    with source.open(request, session) as pull:   # validates, then pins the blocks it still holds
        # session: binding.BoundPull.chunk_session, the handshake's session narrowed to this pull
        send(pull.header)
        for trailer, payload in pull.chunks():
            send(payload, trailer)          # payload stays valid until the pull is closed
        pull.delivered()                    # every chunk left: with hand-off, close() demotes them
    # closed: pins released, even when the requester vanished or a send failed

A following request (PullRequest.follow_ms, a streamed hand-off) is opened with `open_pull`, which
waits for the engine's steps while the blocks are still being computed here (BlockProgress).
"""

import asyncio
import logging
from collections.abc import Iterator
from types import TracebackType
from typing import Protocol, Self

import torch

from radixmesh.common.prefix_cache.prefix_cache import PrefixCache
from radixmesh.kernels.ops import gather_blocks
from radixmesh.node_agent.transfer import Serial, run_inline
from radixmesh.node_agent.transfer.checksum import CHECKSUMS, OFF_LOOP_BYTES, checksum_by_name, chunk_mac
from radixmesh.node_agent.transfer.handshake import Session
from radixmesh.node_agent.transfer.protocol import (
    MAX_CHUNK_BYTES,
    MAX_FOLLOW_MS,
    NO_MAC,
    ChunkTrailer,
    PullHeader,
    PullRequest,
    Status,
    chunk_plan,
)
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.ids import BlockId
from radixmesh.proto.kv_layout import KVLayout

logger = logging.getLogger(__name__)

MAX_PULL_BLOCKS = 1 << 20
"""Longest hash list one request may carry; longer ones are refused as INVALID_ARGUMENT."""


class BlockProgress(Protocol):
    """What the owner's engine is computing, for pulls that follow it (PullRequest.follow_ms)."""

    steps: int
    """Engine steps ended so far (read on the event loop)."""

    def coming(self, block: BlockHash) -> bool:
        """Whether a request active here will compute (or land) `block`; called where the pool may be
        touched (the source's Serial)."""
        ...

    async def stepped(self, since: int) -> None:
        """Return once more than `since` steps have ended."""
        ...


class NothingComputed:
    """The progress of an owner that computes nothing (a bare pool): no block is ever coming."""

    steps = 0

    def coming(self, block: BlockHash) -> bool:
        return False

    async def stepped(self, since: int) -> None:
        raise AssertionError("nothing is coming, so nobody waits for a step")


class OpenPull:
    """One authorised pull: its header, its pinned blocks and a generator of its chunks."""

    def __init__(self, source: "TransferSource", header: PullHeader, blocks: list[BlockId], checksum: str,
                 mac_key: bytes | None = None):
        """`mac_key`: MAC every chunk with it (the pull's key, binding.BoundPull.chunk_key); None: no MAC."""
        self.header = header
        self.blocks = blocks
        self._source = source
        self._checksum = checksum_by_name(checksum) if checksum in CHECKSUMS else None
        self._mac_key = mac_key
        self._closed = False
        self._delivered = False

    def chunks(self) -> Iterator[tuple[ChunkTrailer, torch.Tensor]]:
        """(trailer, contiguous payload) per chunk, gathered lazily so chunk i+1 is built while i is sent.

        A chunk whose blocks are consecutive in the cache is sent as a view of the cache (no copy);
        the pins keep those bytes unchanged until close().
        """
        assert not self._closed and self._checksum is not None
        kv = self._source.kv
        for index, (start, n) in enumerate(chunk_plan(self.header.found, self.header.chunk_blocks)):
            ids = self.blocks[start : start + n]
            if ids == list(range(ids[0], ids[0] + n)):
                payload = kv[ids[0] : ids[0] + n]
            else:
                payload = gather_blocks(kv, ids)
            if self._source.stage_to_host:
                payload = payload.cpu()
            check = self._checksum.of_tensor(payload)
            mac = NO_MAC if self._mac_key is None else chunk_mac(self._mac_key, index, payload)
            yield ChunkTrailer(self.header.pull_id, index, n * self.header.block_bytes, check, mac), payload

    @property
    def off_loop(self) -> bool:
        """Whether each chunk costs enough (checksum or MAC of OFF_LOOP_BYTES or more) to be made
        on a worker thread; its blocks are pinned, so reading them there is safe."""
        work = self._mac_key is not None or (self._checksum is not None and self._checksum.name != "none")
        return work and self.header.chunk_blocks * self.header.block_bytes >= OFF_LOOP_BYTES

    def delivered(self) -> None:
        """Every chunk was sent: the requester now holds the blocks too (see TransferSource.handoff)."""
        self._delivered = True

    def close(self) -> None:
        """Release the pins (idempotent); after delivered(), hand the blocks off when the source does."""
        if not self._closed:
            self._closed = True
            self._source._release(self.blocks, self._delivered)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


class TransferSource:
    """Serves pulls out of one tier: its PrefixCache and the cache tensor those block ids index.

    Requests of another layout or with bad fields get a refusing header and pin nothing; who may
    ask is decided before (the transport's handshake), so `open` takes the authenticated session.
    """

    def __init__(self, cache: PrefixCache, kv: torch.Tensor, layout: KVLayout, *, stage_to_host: bool = False,
                 handoff: bool = False, progress: BlockProgress | None = None):
        """`stage_to_host`: chunks leave as host copies (MemoryPath.CUDA_STAGED: the transport cannot
        read device memory). `handoff`: blocks of a delivered pull go to the front of the cache's
        eviction order (BlockPool.demote), so a conversation that moved keeps one copy, not two.
        `progress`: what this node's engine computes, which following pulls wait for (default:
        nothing; such a pull is answered at once)."""
        if tuple(kv.shape[1:]) != layout.block_shape or kv.dtype != layout.torch_dtype:
            raise ValueError(f"kv {tuple(kv.shape)} {kv.dtype} does not match layout {layout.block_shape}")
        if not kv.is_contiguous():
            raise ValueError("kv must be contiguous so a run of blocks is one slice")
        self.cache = cache
        self.kv = kv
        self.layout = layout
        self.stage_to_host = stage_to_host
        self.handoff = handoff
        self.progress: BlockProgress = progress if progress is not None else NothingComputed()
        self._fingerprint = layout.fingerprint()
        self.pinned_blocks = 0
        """Blocks pinned by open pulls right now."""
        self.handed_off_blocks = 0
        """Blocks demoted after delivered pulls, in total (those still cached when their pull closed)."""

    def open(self, request: PullRequest, session: Session) -> OpenPull:
        """Validate `request` of the authenticated `session` and pin the longest prefix of its hashes
        still cached (at most max_blocks). `session.key` keys the chunk MACs when the request asks for
        them: the transports pass the session narrowed to this one pull (BoundPull.chunk_session)."""
        status, message = self._validate(request)
        if status is not Status.OK:
            logger.info("refused pull %d: %s", request.pull_id, message)
            header = PullHeader(request.pull_id, status, 0, self._fingerprint, self.layout.block_bytes, 1, message)
            return OpenPull(self, header, [], "none")
        if request.follow_ms and request.hashes and request.hashes[0] not in self.cache and (
                self.progress.coming(request.hashes[0])):
            # Looked up before match(), which would count every round of a following pull as a miss.
            header = PullHeader(request.pull_id, Status.NOT_YET, 0, self._fingerprint, self.layout.block_bytes, 1)
            return OpenPull(self, header, [], "none")
        # Pin before anything is sent: a pinned block cannot be evicted and rewritten mid-send.
        blocks = self.cache.match(request.hashes)
        if len(blocks) > request.max_blocks:
            self.cache.release(blocks[request.max_blocks :])
            blocks = blocks[: request.max_blocks]
        self.pinned_blocks += len(blocks)
        chunk_blocks = max(1, request.chunk_bytes // self.layout.block_bytes)
        header = PullHeader(request.pull_id, Status.OK, len(blocks), self._fingerprint,
                            self.layout.block_bytes, chunk_blocks)
        return OpenPull(self, header, blocks, request.checksum, session.key if request.mac else None)

    def check_invariants(self) -> None:
        """The cache's invariants, and no pins counted below zero."""
        assert self.pinned_blocks >= 0, f"pinned_blocks={self.pinned_blocks}"
        self.cache.check_invariants()

    def _validate(self, r: PullRequest) -> tuple[Status, str]:
        if r.fingerprint != self._fingerprint:
            return Status.LAYOUT_MISMATCH, f"layout {r.fingerprint!r} != owner's {self._fingerprint!r}"
        if r.checksum not in CHECKSUMS:
            return Status.INVALID_ARGUMENT, f"unknown checksum {r.checksum!r}; valid: {sorted(CHECKSUMS)}"
        if not 0 < r.chunk_bytes <= MAX_CHUNK_BYTES or r.max_blocks < 0 or len(r.hashes) > MAX_PULL_BLOCKS:
            return Status.INVALID_ARGUMENT, "chunk_bytes must be in (0, 1 GiB], max_blocks >= 0, <= 1M hashes"
        if not 0 <= r.follow_ms <= MAX_FOLLOW_MS:
            return Status.INVALID_ARGUMENT, f"follow_ms must be in [0, {MAX_FOLLOW_MS}], got {r.follow_ms}"
        return Status.OK, ""

    def _release(self, blocks: list[BlockId], delivered: bool) -> None:
        self.pinned_blocks -= len(blocks)
        self.cache.release(blocks)
        # Demote after the release: only cached (ref 0) blocks can move in the eviction order; a
        # block another request here still uses stays where it is (it is being re-used).
        if delivered and self.handoff:
            self.handed_off_blocks += self.cache.demote(blocks)



async def open_pull(source: TransferSource, request: PullRequest, session: Session, serial: Serial = run_inline
                    ) -> OpenPull:
    """`source.open` through `serial`; for a following request answered NOT_YET, again after each
    step of the engine until its first block is cached (or nobody computes it any more) or its
    `follow_ms` has passed. A NOT_YET pull pins nothing, so the wait holds no block."""
    deadline = asyncio.get_running_loop().time() + request.follow_ms / 1000
    while True:
        since = source.progress.steps  # before looking: a step that ends from here on wakes the wait
        pull: OpenPull = await serial(source.open, request, session)
        left = deadline - asyncio.get_running_loop().time()
        if pull.header.status is not Status.NOT_YET or left <= 0:
            return pull
        try:
            async with asyncio.timeout(left):
                await source.progress.stepped(since)
        except TimeoutError:
            pass
