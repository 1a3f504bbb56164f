"""Requester-side transports by the name an agent's config gives (`AgentConfig.transfer`)."""

import logging
from collections.abc import Callable

from radixmesh.node_agent.transfer.handshake import NodeIdentity
from radixmesh.node_agent.transfer.ray_transport import RayTransport
from radixmesh.node_agent.transfer.transport import Transport
from radixmesh.node_agent.transfer.ucx_transport import UcxTransport

logger = logging.getLogger(__name__)

TRANSPORTS: dict[str, Callable[[NodeIdentity], Transport]] = {"ucx": UcxTransport, "ray": RayTransport}


def transport_by_name(name: str, identity: NodeIdentity) -> Transport:
    """A new transport: "ucx", "ray", or "auto" (ucx where ucxx loads, else the Ray fallback)."""
    if name == "auto":
        try:
            return UcxTransport(identity)
        except ImportError as e:
            logger.warning("ucxx cannot load (%s); KV transfers use the Ray object store", e)
            return RayTransport(identity)
    if name not in TRANSPORTS:
        raise ValueError(f"unknown transport {name!r}; valid: ['auto', 'ray', 'ucx']")
    return TRANSPORTS[name](identity)
