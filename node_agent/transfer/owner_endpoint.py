"""The owner's side of an agent's transfer plane, one endpoint per transport, chosen from a registry.

Both serve the same TransferSource (authentication, pinning, chunking and checksums live there, once)
and run its pins and unpins on the agent's engine thread (`serial`); they differ in how a requester
reaches them, which is what the registered transfer address says:

    "host:port"      UcxEndpoint: a TransferServer bound to the agent's host (UCX payload)
    "ray:<actor>"    RayEndpoint: the agent's own Ray actor streams pulls through the object store
"""

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable
from typing import Any

import ray

from radixmesh.node_agent.transfer import Serial
from radixmesh.node_agent.transfer.handshake import NodeIdentity, ReplayGuard
from radixmesh.node_agent.transfer.pull_source import TransferSource
from radixmesh.node_agent.transfer.ray_transport import serve_pull
from radixmesh.node_agent.transfer.server import TransferServer
from radixmesh.node_agent.transfer.transport import Peer, TransportError
from radixmesh.proto.ids import NodeId

RAY_ADDRESS_PREFIX = "ray:"


def parse_address(node: NodeId, address: str) -> Peer:
    """The endpoint of `node` that `address` names: "host:port" or "ray:<actor name>"; ValueError otherwise."""
    if address.startswith(RAY_ADDRESS_PREFIX):
        name = address.removeprefix(RAY_ADDRESS_PREFIX)
        if not name:
            raise ValueError(f"transfer address {address!r} names no actor")
        return Peer(node, actor_name=name)
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"transfer address must be host:port or ray:<actor name>, got {address!r}")
    return Peer(node, host, int(port))


class TransferEndpoint(ABC):
    """Serves pulls of one TransferSource until stopped."""

    transport: str
    """The requester-side transport (transports.transport_by_name) that reaches this endpoint."""

    @abstractmethod
    async def start(self) -> str:
        """Start serving; returns the transfer address peers pull from."""

    @abstractmethod
    async def stop(self) -> None:
        """Stop serving and release the pins of the pulls it ends. Idempotent."""


class UcxEndpoint(TransferEndpoint):
    """A TransferServer on `host:port` (port 0: any free port)."""

    transport = "ucx"

    def __init__(self, source: TransferSource, host: str, port: int, serial: Serial, identity: NodeIdentity) -> None:
        self._host = host
        self._server = TransferServer(source, host, port, secret=identity.secret, node_id=identity.node_id,
                                      loopback=host.startswith("127."), serial=serial)

    async def start(self) -> str:
        return f"{self._host}:{await self._server.start()}"

    async def stop(self) -> None:
        await self._server.stop()


class RayEndpoint(TransferEndpoint):
    """Pulls served by the Ray actor this agent runs in, found by the actor's name (so `start`
    raises ValueError outside a named actor: use actor.make_agent_actor)."""

    transport = "ray"

    def __init__(self, source: TransferSource, host: str, port: int, serial: Serial, identity: NodeIdentity) -> None:
        # host and port are the UCX endpoint's: peers reach this one by the actor's name instead.
        self._source = source
        self._serial = serial
        self._identity = identity
        self._guard = ReplayGuard()
        self._serving = False

    async def start(self) -> str:
        name = ray.get_runtime_context().get_actor_name() if ray.is_initialized() else None
        if not name:
            raise ValueError("transfer='ray' serves pulls through the agent's own named Ray actor; "
                             "start the agent with make_agent_actor")
        self._serving = True
        return RAY_ADDRESS_PREFIX + name

    async def stop(self) -> None:
        # Pulls already streaming release their pins in their own `finally`; new ones are refused.
        self._serving = False

    async def serve_pull(self, request: bytes) -> AsyncIterator[Any]:
        """ray_transport's stream of one pull (header, then chunks); TransportError once stopped."""
        if not self._serving:
            raise TransportError("this agent's transfer endpoint is stopped")
        async for item in serve_pull(self._source, request, self._identity, self._guard, self._serial):
            yield item


ENDPOINTS: dict[str, Callable[[TransferSource, str, int, Serial, NodeIdentity], TransferEndpoint]] = {
    "ucx": UcxEndpoint, "ray": RayEndpoint}
"""Owner-side endpoints by the name of the transport that reaches them."""
