"""The keyed MAC of one chunk: BLAKE2b-128 keyed by the handshake's session key, over the pull id,
the chunk index and the payload, so a chunk cannot be altered, cut short or moved to another
position or pull without the requester noticing."""

import hashlib
import struct

import torch

from radixmesh.node_agent.transfer.checksum import tensor_bytes
from radixmesh.node_agent.transfer.protocol import MAC_BYTES

_POSITION = struct.Struct("<QI")


def chunk_mac(key: bytes, pull_id: int, index: int, payload: torch.Tensor) -> bytes:
    """MAC of chunk `index` of pull `pull_id`; a device payload is copied to the host first."""
    h = hashlib.blake2b(_POSITION.pack(pull_id, index), digest_size=MAC_BYTES, key=key)
    h.update(tensor_bytes(payload if payload.device.type == "cpu" else payload.cpu()))
    return h.digest()
