"""TransferClient: pull prefix blocks from a peer into the local pool and PrefixCache.

Two ways in: `pull` does it all (allocate, receive, insert); `receive` only streams into blocks the
caller allocated and lands (the node agent). A pull never fails the caller's request: it returns
the intact prefix that arrived and an outcome, and frees the rest. Nothing the owner says sizes
anything here, and every message is bound to the session (transfer.binding). Threads, checks and
why: docs/routing.md#the-requesters-side.
"""

import asyncio
import hmac
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple

import torch

from radixmesh.common.prefix_cache.prefix_cache import PrefixCache
from radixmesh.kernels.ops import scatter_blocks
from radixmesh.node_agent.memory.node_memory import allocate_up_to
from radixmesh.node_agent.transfer import Serial, run_inline
from radixmesh.node_agent.transfer.checksum import (
    DEFAULT_CHECKSUM,
    OFF_LOOP_BYTES,
    checksum_by_name,
    chunk_mac,
)
from radixmesh.node_agent.transfer.protocol import (
    MAX_CHUNK_BYTES,
    MAX_FOLLOW_MS,
    ChunkTrailer,
    PullHeader,
    PullRequest,
    Status,
    chunk_plan,
)
from radixmesh.node_agent.transfer.stats import PeerStats
from radixmesh.node_agent.transfer.transport import (
    Peer,
    PeerChannel,
    PeerUnauthenticated,
    Transport,
    TransportError,
)
from radixmesh.proto.block_hash import HASH_BYTES, BlockHash
from radixmesh.proto.ids import BlockId, NodeId
from radixmesh.proto.kv_layout import KVLayout

logger = logging.getLogger(__name__)

_PULL_IDS = itertools.count(1)
"""Process-wide, so a pull id names one pull in logs and replies; the UCX tags of a pull are secret
(binding.BoundPull.tag_base), so a predictable id gives nobody a way into a pull."""


@dataclass(frozen=True, slots=True)
class PullConfig:
    """Settings of the requester's side of the transfer plane."""

    chunk_bytes: int = 4 << 20
    """Staging size: pulls move in chunks of this many bytes (at least one block each)."""
    checksum: str = DEFAULT_CHECKSUM
    """"none" (default), "crc32" or "adler32"; see checksum.DEFAULT_CHECKSUM for why."""
    mac: bool = False
    """Verify a keyed MAC of every chunk (checksum.chunk_mac): integrity end to end against anyone
    but the authenticated owner. bench/transfer.py measures its cost."""
    timeout_s: float = 10.0
    """Bound on one whole pull; past it the pull returns what arrived intact."""
    follow_s: float = 120.0
    """Bound on one followed pull (a streamed hand-off, TransferClient.receive's `follow_s`) in all,
    the owner's queue and compute included; past it the rest is recomputed."""
    ewma_alpha: float = 0.2
    wire_block_bytes: int = 0
    """Bytes one block stands for on the wire (a modeled engine's full KV per block, model.modeled);
    pulls are counted and timed in them. 0: the block's own bytes."""
    wire_gbps: float = 0.0
    """A modeled link: a pull's payload takes at least its wire bytes at this rate (GB/s) after the
    owner's header, on top of what the transport itself takes. 0: no floor."""

    def __post_init__(self) -> None:
        checksum_by_name(self.checksum)
        if self.wire_block_bytes < 0 or not self.wire_gbps >= 0:
            raise ValueError("wire_block_bytes and wire_gbps must be >= 0")
        if not 0 < self.chunk_bytes <= MAX_CHUNK_BYTES or self.timeout_s <= 0 or not 0 < self.ewma_alpha <= 1:
            raise ValueError("chunk_bytes must be in (0, 1 GiB], timeout_s positive, ewma_alpha in (0, 1]")
        if not self.follow_s > 0:
            raise ValueError(f"follow_s must be positive, got {self.follow_s}")


class PullOutcome(StrEnum):
    OK = "ok"
    """Every block the owner still held arrived (possibly fewer than asked: partial availability)."""
    UNAUTHENTICATED = "unauthenticated"
    LAYOUT_MISMATCH = "layout_mismatch"
    INVALID_ARGUMENT = "invalid_argument"
    CHECKSUM_MISMATCH = "checksum_mismatch"
    TIMEOUT = "timeout"
    PEER_LOST = "peer_lost"
    NO_SPACE = "no_space"
    NOT_YET = "not_yet"
    """A following pull's round: none of the blocks is computed yet on the owner (ask again)."""


_REFUSALS = {Status.UNAUTHENTICATED: PullOutcome.UNAUTHENTICATED,
             Status.LAYOUT_MISMATCH: PullOutcome.LAYOUT_MISMATCH,
             Status.INVALID_ARGUMENT: PullOutcome.INVALID_ARGUMENT}


class PullResult(NamedTuple):
    """`block_ids[i]` holds `hashes[i]`; the caller holds one reference on each and must release it."""

    hashes: list[BlockHash]
    block_ids: list[BlockId]
    nbytes: int
    seconds: float
    outcome: PullOutcome

    @property
    def blocks(self) -> int:
        return len(self.block_ids)


class _Refused(Exception):
    def __init__(self, outcome: PullOutcome, message: str):
        super().__init__(message)
        self.outcome = outcome


def _check_hashes(hashes: Sequence[BlockHash]) -> None:
    if any(len(h) != HASH_BYTES for h in hashes) or len(set(hashes)) != len(hashes):
        raise ValueError(f"hashes must be distinct {HASH_BYTES}-byte block hashes")


class TransferClient:
    """Pulls into `cache` (its pool) and `kv` (the tensor its block ids index), over `transport`.

    One channel per peer, reused across pulls and reopened after a failure; pulls from one peer
    are serialised, pulls from different peers run concurrently.
    """

    def __init__(self, cache: PrefixCache, kv: torch.Tensor, layout: KVLayout, config: PullConfig,
                 transport: Transport, *, clock: Callable[[], float] = time.perf_counter,
                 serial: Serial = run_inline):
        """`serial` runs every pool and cache touch (allocate, insert, free); the node agent passes
        its engine thread, whose pool is not thread-safe."""
        if tuple(kv.shape[1:]) != layout.block_shape or kv.dtype != layout.torch_dtype:
            raise ValueError(f"kv {tuple(kv.shape)} {kv.dtype} does not match layout {layout.block_shape}")
        self.cache = cache
        self.kv = kv
        self.layout = layout
        self.config = config
        self.transport = transport
        self._clock = clock
        self._serial = serial
        self._checksum = checksum_by_name(config.checksum)
        self._fingerprint = layout.fingerprint()
        self._chunk_blocks = max(1, config.chunk_bytes // layout.block_bytes)
        self._channels: dict[NodeId, PeerChannel] = {}
        self._locks: dict[NodeId, asyncio.Lock] = {}
        self.stats: dict[NodeId, PeerStats] = {}

    async def pull(self, peer: Peer, hashes: Sequence[BlockHash], parent: BlockHash | None = None) -> PullResult:
        """Pull the longest prefix of `hashes` that `peer` holds; insert it into the cache.

        `parent` is the hash before hashes[0] (None at a sequence start). ValueError on malformed
        hashes, before anything is allocated or sent.
        """
        _check_hashes(hashes)
        start = self._clock()
        blocks: list[BlockId] = await self._serial(allocate_up_to, self.cache.pool, len(hashes))
        received = 0
        try:
            result = await self.receive(peer, hashes, blocks, start=start)
            received = result.blocks
        finally:
            await self._serial(self._keep, hashes, blocks, received, parent)
        return result

    async def receive(self, peer: Peer, hashes: Sequence[BlockHash], blocks: Sequence[BlockId], *,
                      start: float | None = None, follow_s: float = 0.0) -> PullResult:
        """Stream the longest prefix of `hashes` that `peer` holds into `blocks` (one per hash, fewer
        when the caller found no room for all: the owner sends at most that many).

        The caller holds `blocks`, and nothing reads or writes them but this pull until it returns;
        then it keeps or frees them. The result names the blocks that arrived intact (a prefix of
        `blocks`); the others may hold anything. Cancelled, it raises only once the channel is
        closed, so nothing of the pull is written into `blocks` afterwards. `start`: when the pull
        began (its allocation), for its time; now by default.

        `follow_s` > 0 follows blocks the owner is still computing (a streamed hand-off): the pull
        asks again, round by round, for the blocks that have not arrived, each round waiting on the
        owner until at least one is computed (PullRequest.follow_ms), and ends once every block
        arrived, the owner holds and computes none of the rest, or `follow_s` passed (TIMEOUT). Its
        time is the owner's compute as much as the link's, so it is not folded into the peer's
        priced averages (PeerStats.record).
        """
        _check_hashes(hashes)
        if len(blocks) > len(hashes):
            raise ValueError(f"{len(blocks)} blocks for {len(hashes)} hashes")
        start = self._clock() if start is None else start
        received, latency = 0, 0.0
        outcome = PullOutcome.NO_SPACE if hashes else PullOutcome.OK
        if blocks and follow_s > 0:
            received, latency, outcome = await self._follow(peer, hashes, blocks, start, start + follow_s)
        elif blocks:
            received, latency, outcome = await self._round(peer, hashes, blocks, start, 0)
        seconds = self._clock() - start
        nbytes = received * (self.config.wire_block_bytes or self.layout.block_bytes)
        stats = self.stats.setdefault(peer.node_id, PeerStats(self.transport.name, self.config.ewma_alpha))
        stats.record(outcome, received, nbytes, seconds, latency, priced=not follow_s)
        return PullResult(list(hashes[:received]), list(blocks[:received]), nbytes, seconds, outcome)

    async def _round(self, peer: Peer, hashes: Sequence[BlockHash], blocks: Sequence[BlockId], start: float,
                     follow_ms: int) -> tuple[int, float, PullOutcome]:
        """One request to the owner and what it sends (_stream), under the peer's lock."""
        async with self._locks.setdefault(peer.node_id, asyncio.Lock()):
            received, latency, outcome = await self._stream(peer, hashes, blocks, start, follow_ms)
            # Under the peer's lock: pulls from one peer share its modeled link one at a time.
            await self._wire_floor(received, start + latency)
        return received, latency, outcome

    async def _follow(self, peer: Peer, hashes: Sequence[BlockHash], blocks: Sequence[BlockId], start: float,
                      deadline: float) -> tuple[int, float, PullOutcome]:
        """Rounds of a following pull (receive's `follow_s`): blocks [0, received) have arrived, each
        round asks for [received, len(blocks)). The peer's lock is taken per round, so other pulls
        from the same owner go between them."""
        received, first_latency, outcome = 0, 0.0, PullOutcome.OK
        while received < len(blocks):
            left = deadline - self._clock()
            if left <= 0:
                outcome = PullOutcome.TIMEOUT
                break
            follow_ms = max(1, min(MAX_FOLLOW_MS, int(left * 1000)))
            round_start = self._clock()
            n, latency, outcome = await self._round(peer, hashes[received:], blocks[received:], round_start, follow_ms)
            first_latency = first_latency or round_start + latency - start
            received += n
            if outcome is PullOutcome.NOT_YET:
                outcome = PullOutcome.OK
            elif outcome is not PullOutcome.OK or n == 0:  # failed, or the owner neither holds nor computes the rest
                break
        return received, first_latency, outcome

    async def _wire_floor(self, received: int, payload_start: float) -> None:
        """Wait until `received` blocks' wire bytes have crossed a modeled link (config.wire_gbps)."""
        if not (self.config.wire_gbps and received):
            return
        wire_s = received * (self.config.wire_block_bytes or self.layout.block_bytes) / (self.config.wire_gbps * 1e9)
        wait = payload_start + wire_s - self._clock()
        if wait > 0:
            await asyncio.sleep(wait)

    async def _stream(self, peer: Peer, hashes: Sequence[BlockHash], blocks: Sequence[BlockId], start: float,
                      follow_ms: int = 0) -> tuple[int, float, PullOutcome]:
        """Request, receive, verify and scatter; returns (blocks received intact, latency, outcome).
        `follow_ms`: the owner may wait that long for the first block (PullRequest.follow_ms)."""
        received, latency, outcome = 0, 0.0, PullOutcome.OK
        drained = False  # the channel is reusable only when nothing of this pull is still in flight
        try:
            async with asyncio.timeout(self.config.timeout_s + follow_ms / 1000):
                channel = await self._channel(peer)
                header = await channel.request(self._request(hashes, len(blocks), follow_ms))
                latency = self._clock() - start
                drained = header.status is not Status.OK
                if header.status is Status.NOT_YET and follow_ms:
                    return 0, latency, PullOutcome.NOT_YET
                self._accept(header, len(blocks))
                plan = chunk_plan(header.found, header.chunk_blocks)
                index = 0
                async for trailer, payload in channel.chunks(header):
                    first, n = plan[index]
                    nbytes = n * self.layout.block_bytes
                    if (trailer.pull_id, trailer.index, trailer.nbytes, payload.numel()) != (
                            header.pull_id, index, nbytes, nbytes):
                        raise _Refused(PullOutcome.INVALID_ARGUMENT, f"chunk {index}: out of order or not {nbytes} bytes")
                    if not await self._intact(channel.pull.chunk_key, index, payload, trailer):
                        raise _Refused(PullOutcome.CHECKSUM_MISMATCH, f"chunk {trailer.index} corrupted")
                    index += 1
                    buf = payload.view(self.layout.torch_dtype).view(n, *self.layout.block_shape)
                    scatter_blocks(buf, self.kv, blocks[first : first + n])
                    received = first + n
                drained = True
        except _Refused as e:
            outcome = e.outcome
            logger.warning("pull from %s refused: %s", peer.node_id, e)
        except TimeoutError:
            outcome = PullOutcome.TIMEOUT
        except PeerUnauthenticated as e:
            outcome = PullOutcome.UNAUTHENTICATED
            logger.warning("pull from %s refused: %s", peer.node_id, e)
        except TransportError as e:
            outcome = PullOutcome.PEER_LOST
            logger.warning("pull from %s failed: %s", peer.node_id, e)
        finally:
            if not drained:
                await self._drop_channel(peer.node_id)
        return received, latency, outcome

    async def close(self) -> None:
        """Close every channel."""
        for node in list(self._channels):
            await self._drop_channel(node)

    async def _intact(self, chunk_key: bytes, index: int, payload: torch.Tensor, trailer: ChunkTrailer) -> bool:
        """Whether the chunk matches its trailer's checksum and, when asked, its MAC; off the loop when
        there is work to do on a large chunk."""
        work = self.config.mac or self._checksum.name != "none"
        if work and payload.numel() >= OFF_LOOP_BYTES:
            return await asyncio.to_thread(self._verify, chunk_key, index, payload, trailer)
        return self._verify(chunk_key, index, payload, trailer)

    def _verify(self, chunk_key: bytes, index: int, payload: torch.Tensor, trailer: ChunkTrailer) -> bool:
        if self._checksum.of_tensor(payload) != trailer.checksum:
            return False
        return not self.config.mac or hmac.compare_digest(chunk_mac(chunk_key, index, payload), trailer.mac)

    def _request(self, hashes: Sequence[BlockHash], max_blocks: int, follow_ms: int = 0) -> PullRequest:
        return PullRequest(next(_PULL_IDS), self._fingerprint, tuple(hashes), max_blocks,
                           self.config.chunk_bytes, self.config.checksum, self.config.mac, follow_ms)

    def _accept(self, header: PullHeader, allocated: int) -> None:
        if header.status is not Status.OK:
            raise _Refused(_REFUSALS.get(header.status, PullOutcome.INVALID_ARGUMENT), header.message)
        if header.fingerprint != self._fingerprint or header.block_bytes != self.layout.block_bytes:
            raise _Refused(PullOutcome.LAYOUT_MISMATCH, f"owner answered layout {header.fingerprint!r}")
        if header.found > allocated:
            raise _Refused(PullOutcome.INVALID_ARGUMENT, f"owner sends {header.found} > {allocated} blocks")
        if header.chunk_blocks != self._chunk_blocks:
            # The requester sizes its staging: an owner's chunk size would let it ask for any amount.
            raise _Refused(PullOutcome.INVALID_ARGUMENT,
                           f"owner chunks {header.chunk_blocks} blocks, {self._chunk_blocks} were asked for")

    def _keep(self, hashes: Sequence[BlockHash], blocks: list[BlockId], received: int,
              parent: BlockHash | None) -> None:
        # [0, received) arrived intact and become matchable; [received, allocated) go back to the pool.
        self.cache.pool.free(blocks[received:])
        if received:
            self.cache.insert(hashes[:received], blocks[:received], parent)

    async def _channel(self, peer: Peer) -> PeerChannel:
        channel = self._channels.get(peer.node_id)
        if channel is None:
            channel = await self.transport.connect(peer)
            self._channels[peer.node_id] = channel
        return channel

    async def _drop_channel(self, node: NodeId) -> None:
        channel = self._channels.pop(node, None)
        if channel is not None:
            await channel.close()
