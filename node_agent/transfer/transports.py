"""Requester-side transports by the name an agent's config gives (`AgentConfig.transfer`)."""

import logging

import torch

from radixmesh.node_agent.transfer.handshake import NodeIdentity
from radixmesh.node_agent.transfer.ray_transport import RayTransport
from radixmesh.node_agent.transfer.transport import Transport
from radixmesh.node_agent.transfer.ucx_transport import UcxTransport

logger = logging.getLogger(__name__)

NAMES = ("auto", "ray", "ucx")


def transport_by_name(name: str, identity: NodeIdentity,
                      pool_device: torch.device = torch.device("cpu")) -> Transport:  # noqa: B008  (immutable)
    """A new transport: "ucx", "ray", or "auto" (ucx where ucxx loads, else the Ray fallback), for a
    pool on `pool_device` (UCX receives into device memory where it can move it, memory_path)."""
    if name not in NAMES:
        raise ValueError(f"unknown transport {name!r}; valid: {list(NAMES)}")
    if name == "ray":
        return RayTransport(identity)
    try:
        return UcxTransport(identity, pool_device=pool_device)
    except ImportError as e:
        if name == "ucx":
            raise
        logger.warning("ucxx cannot load (%s); KV transfers use the Ray object store", e)
        return RayTransport(identity)
