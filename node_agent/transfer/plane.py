"""The agent's end of the KV transfer plane: an endpoint serving its gpu tier (owner_endpoint.py) and a
TransferClient pulling into it over the matching transport. The owner's pins run as the engine
runner's short jobs (`serial`: EngineRunner.call_short, beside a step's forward); a pull's blocks are allocated and landed by the agent's engine
(Request.pending_prefix), and this plane only streams into them."""

import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import torch

from radixmesh.common.block_pool.eviction import DEFAULT_HANDOFF
from radixmesh.node_agent.memory.tiers import TierMemory
from radixmesh.node_agent.transfer import Serial
from radixmesh.node_agent.transfer.client import PullConfig, PullOutcome, TransferClient
from radixmesh.node_agent.transfer.handshake import NodeIdentity
from radixmesh.node_agent.transfer.memory_path import MemoryPath, memory_path
from radixmesh.node_agent.transfer.owner_endpoint import ENDPOINTS, RayEndpoint, parse_address
from radixmesh.node_agent.transfer.pull_source import BlockProgress, TransferSource
from radixmesh.node_agent.transfer.ray_transport import RayTransport
from radixmesh.node_agent.transfer.stats import PeerStats
from radixmesh.node_agent.transfer.transport import Transport, TransportError
from radixmesh.node_agent.transfer.ucx_transport import UcxTransport
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.ids import BlockId, NodeId
from radixmesh.proto.kv_layout import KVLayout

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Pulled:
    """What one planned pull delivered: `block_ids[i]` holds `hashes[i]` (a prefix of the blocks
    streamed into)."""

    hashes: tuple[BlockHash, ...]
    block_ids: tuple[BlockId, ...]
    nbytes: int
    seconds: float
    failed: bool
    """Fewer blocks arrived than were asked for (the rest are recomputed)."""

    @classmethod
    def nothing(cls, failed: bool = False) -> "Pulled":
        return cls((), (), 0, 0.0, failed)


@dataclass(frozen=True, slots=True)
class TransferConfig:
    """Settings of an agent's transfer plane (the agent builds them from its AgentConfig)."""

    transport: str
    """"ucx", "ray", "auto" (ucx where ucxx loads, else ray; transport_by_name) or "none" (NoTransfer)."""
    identity: NodeIdentity
    """Who this node is on the plane: the handshake's credential derives from it."""
    host: str = "127.0.0.1"
    """Address the endpoint binds (and advertises)."""
    port: int = 0
    """0: any free port."""
    handoff: bool = DEFAULT_HANDOFF
    """Blocks sent whole to a peer go first when this node evicts (TransferSource.handoff)."""
    pull: PullConfig = field(default_factory=PullConfig)
    """The requester's side; pulls into a host pool over UCX take HOST_CHUNK_BYTES chunks."""


class TransferPlane(Protocol):
    """What the agent asks of its transfer plane; `make_transfer_plane` picks one from its config."""

    transport: str
    address: str
    """Where peers pull from ("" when nothing is served)."""

    @property
    def memory_path(self) -> MemoryPath | None:
        """Which memory pulled bytes travel through (None without a plane). Read-only, so a plane
        that always has one (AgentTransfer: MemoryPath) and one that never does (NoTransfer: None)
        both satisfy it."""
        ...

    async def start(self) -> None: ...
    async def stop(self) -> None: ...

    def reaches(self, peer: NodeId, address: str) -> bool:
        """Whether this plane can pull from `peer` at `address` (ValueError for a malformed address)."""
        ...

    async def receive(self, peer: NodeId, address: str, hashes: list[BlockHash], blocks: list[BlockId], *,
                      follow: bool = False) -> Pulled: ...

    def serve_pull(self, request: bytes) -> AsyncIterator[Any]: ...
    def peer_stats(self) -> Mapping[NodeId, PeerStats]: ...
    def peer_gbps(self) -> dict[str, float]: ...


def make_transfer_plane(tier: TierMemory, layout: KVLayout, config: TransferConfig, serial: Serial,
                        progress: BlockProgress | None = None) -> TransferPlane:
    """The plane `config.transport` names: "none" serves nothing and recomputes every planned pull.
    `progress`: what the node's engine computes, which peers' following pulls wait for."""
    if config.transport == "none":
        return NoTransfer()
    return AgentTransfer(tier, layout, config, serial, progress=progress)


class NoTransfer:
    """The transfer plane of an agent without one: it serves no pulls, and a planned pull delivers
    nothing (the blocks are recomputed, and the result says the pull failed)."""

    transport = "none"
    address = ""
    memory_path = None

    async def start(self) -> None:
        """Nothing to start."""

    async def stop(self) -> None:
        """Nothing to stop."""

    def reaches(self, peer: NodeId, address: str) -> bool:
        return False

    async def receive(self, peer: NodeId, address: str, hashes: list[BlockHash], blocks: list[BlockId], *,
                      follow: bool = False) -> Pulled:
        return Pulled.nothing(failed=True)

    async def serve_pull(self, request: bytes) -> AsyncIterator[Any]:
        raise TransportError("this agent has no transfer plane")
        yield  # an async generator, like the real plane's

    def peer_stats(self) -> Mapping[NodeId, PeerStats]:
        return {}

    def peer_gbps(self) -> dict[str, float]:
        return {}


HOST_CHUNK_BYTES = 16 << 20
"""Chunk size of pulls into a host-memory pool. Every chunk costs the requester a control frame, a
UCX receive and a scatter, each a wake-up of an event loop that shares the cores (and the GIL) with
a busy engine: on 2 shared cores with both engines decoding, 16 MiB chunks instead of 4 MiB raised
pulls of 16-256 MiB from 0.43-0.62x to 0.65-0.83x a plain socket (bench/transfer.py, ratios within
each run). The staging costs two chunks per peer channel; device pools (GPU or pinned staging) and
the Ray transport keep PullConfig's 4 MiB: unmeasured here."""


class AgentTransfer:
    """Serves pulls of the tier's cached blocks and pulls peers' blocks into it, over config.transport
    ("auto" resolves to ucx where ucxx loads, else ray)."""

    def __init__(self, tier: TierMemory, layout: KVLayout, config: TransferConfig, serial: Serial, *,
                 clock: Callable[[], float] = time.perf_counter, progress: BlockProgress | None = None) -> None:
        transport = transport_by_name(config.transport, config.identity, tier.kv.device)
        self.memory_path = memory_path(tier.kv.device, transport.active_transports)
        source = TransferSource(tier.cache, tier.kv, layout, stage_to_host=self.memory_path.staged,
                                handoff=config.handoff, progress=progress)
        self._endpoint = ENDPOINTS[transport.name](source, config.host, config.port, serial, config.identity)
        client_config = config.pull
        if transport.name == "ucx" and self.memory_path is MemoryPath.HOST:
            client_config = replace(client_config, chunk_bytes=HOST_CHUNK_BYTES)
        self._client = TransferClient(tier.cache, tier.kv, layout, client_config, transport,
                                      clock=clock, serial=serial)
        self.transport = transport.name
        self.address = ""

    async def start(self) -> None:
        self.address = await self._endpoint.start()

    async def stop(self) -> None:
        await self._client.close()
        await self._endpoint.stop()

    def reaches(self, peer: NodeId, address: str) -> bool:
        if bool(parse_address(peer, address).actor_name) != (self.transport == "ray"):
            logger.warning("peer %s serves pulls at %r, out of reach of transport %s: recomputing",
                           peer, address, self.transport)
            return False
        return True

    async def receive(self, peer: NodeId, address: str, hashes: list[BlockHash], blocks: list[BlockId], *,
                      follow: bool = False) -> Pulled:
        """Stream `hashes` (a run of one prompt's blocks) from `peer` into `blocks`, which the caller
        holds and lands (TransferClient.receive; `follow`: the peer is still computing them, follow
        them for PullConfig.follow_s at most); never raises for a peer's fault: what did not arrive
        intact is reported missing."""
        follow_s = self._client.config.follow_s if follow else 0.0
        result = await self._client.receive(parse_address(peer, address), hashes, blocks, follow_s=follow_s)
        failed = result.blocks < len(hashes) or result.outcome is not PullOutcome.OK
        if failed:
            logger.info("pull of %d blocks from %s delivered %d (%s)", len(hashes), peer, result.blocks,
                        result.outcome)
        return Pulled(tuple(result.hashes), tuple(result.block_ids), result.nbytes, result.seconds, failed)

    async def serve_pull(self, request: bytes) -> AsyncIterator[Any]:
        """One pull through the object store (ray_transport.serve_pull); TransportError unless this
        agent's transport is ray."""
        if not isinstance(self._endpoint, RayEndpoint):
            raise TransportError(f"this agent serves pulls over {self.transport}, not through its actor")
        async for item in self._endpoint.serve_pull(request):
            yield item

    def peer_stats(self) -> Mapping[NodeId, PeerStats]:
        return self._client.stats

    def peer_gbps(self) -> dict[str, float]:
        """Measured pull bandwidth by peer (GB/s), for heartbeats."""
        return {peer: s.ewma_gbps for peer, s in self._client.stats.items() if s.ewma_gbps > 0}


TRANSPORT_NAMES = ("auto", "ray", "ucx")


def transport_by_name(name: str, identity: NodeIdentity,
                      pool_device: torch.device = torch.device("cpu")) -> Transport:  # noqa: B008  (immutable)
    """A new transport: "ucx", "ray", or "auto" (ucx where ucxx loads, else the Ray fallback), for a
    pool on `pool_device` (UCX receives into device memory where it can move it, memory_path)."""
    if name not in TRANSPORT_NAMES:
        raise ValueError(f"unknown transport {name!r}; valid: {list(TRANSPORT_NAMES)}")
    if name == "ray":
        return RayTransport(identity)
    try:
        return UcxTransport(identity, pool_device=pool_device)
    except ImportError as e:
        if name == "ucx":
            raise
        logger.warning("ucxx cannot load (%s); KV transfers use the Ray object store", e)
        return RayTransport(identity)
