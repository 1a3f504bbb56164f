"""The requester's view of a transport: one channel per peer that carries pulls; a registry by name.

Transports differ only in how request, header and payload travel (UCX: a TCP control connection
plus UCX tagged messages; Ray: an actor's streaming generator). Authentication, pinning, chunking,
checksums and pool bookkeeping live outside them (TransferSource, TransferClient), once.
"""

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass

import torch

from radixmesh.node_agent.transfer.binding import BoundPull
from radixmesh.node_agent.transfer.protocol import ChunkTrailer, PullHeader, PullRequest
from radixmesh.proto.ids import NodeId


@dataclass(frozen=True, slots=True)
class Peer:
    """Where a peer's transfer endpoint is: its TransferServer's address, or its Ray actor's name."""

    node_id: NodeId
    host: str = ""
    port: int = 0
    actor_name: str = ""


class TransportError(Exception):
    """The channel broke (peer died, connection closed, malformed reply); the channel is unusable."""


class PeerUnauthenticated(TransportError):
    """The peer did not prove the node credential it should hold, or refused ours."""


class PeerChannel(ABC):
    """An open connection to one peer. Pulls on one channel run one at a time (callers serialise).

    `pull` is the pull that the last `request` opened, bound to the channel's authenticated session
    (transfer.binding): its key checks the chunk MACs.
    """

    pull: BoundPull

    @abstractmethod
    async def request(self, request: PullRequest) -> PullHeader:
        """Send `request` sealed to the session and return the owner's header, once it proved to answer
        this very request. Raises TransportError (PeerUnauthenticated when a message of the pull is not
        bound to the session: altered or injected in flight)."""

    @abstractmethod
    def chunks(self, header: PullHeader) -> AsyncIterator[tuple[ChunkTrailer, torch.Tensor]]:
        """The chunks announced by `header`, in order, as (trailer, uint8 payload of exactly the
        announced length): a chunk out of order, of another pull, shorter or longer than its share
        of `header` raises TransportError.

        A payload is only valid until the next iteration (staging is reused). Raises TransportError.
        """

    @abstractmethod
    async def close(self) -> None:
        """Close the channel; a channel whose pull failed is closed and reopened by the caller.

        Closing guarantees no late payload is ever written into memory the caller owns.
        """


class Transport(ABC):
    """Opens channels to peers."""

    name: str

    def active_transports(self) -> frozenset[str]:
        """The UCX transports in use (memory_path reads cuda_copy from them); none: host memory only."""
        return frozenset()

    @abstractmethod
    async def connect(self, peer: Peer) -> PeerChannel:
        """A new channel to `peer`. Raises TransportError when it cannot be reached,
        PeerUnauthenticated when it does not prove `peer.node_id`'s credential."""
