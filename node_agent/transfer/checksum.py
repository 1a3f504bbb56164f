"""Payload integrity for KV transfers: checksums chosen by name from a registry, and the keyed chunk MAC.

The checksum guards against a peer that sends the wrong bytes (a bug, a torn buffer, a corrupted
link), not against an attacker: the handshake authenticates the peer, and the keyed chunk MAC
(`chunk_mac`, TransferConfig.mac) is what an attacker on the path cannot forge. TCP and RDMA
links carry their own CRCs, so the default is decided by what the checksum costs relative to the
transfer; bench/transfer.py measures both in one run.
"""

import hashlib
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from radixmesh.node_agent.transfer.protocol import MAC_BYTES

DEFAULT_CHECKSUM = "none"
"""Off by default: TCP and RDMA links already carry CRCs, and on the loopback bench crc32 cost 10-35%
of a pull's throughput (bench/results/transfer.json, pull_gbps vs pull_crc32_gbps). Set "crc32" where
payloads cross untrusted hops or buffers: every chunk is then verified end to end and a corrupted
chunk is refused (the blocks before it are kept)."""


@dataclass(frozen=True, slots=True)
class Checksum:
    """One algorithm: `compute(buffer) -> int` over the raw bytes of a chunk (fits in 64 bits)."""

    name: str
    compute: Callable[[memoryview], int]

    def of_tensor(self, t: torch.Tensor) -> int:
        """Checksum of a contiguous tensor's bytes; a device tensor is copied to the host first,
        which is why GPU deployments should run with "none" (links there carry their own CRC)."""
        if self.name == "none":
            return 0
        return self.compute(tensor_bytes(t if t.device.type == "cpu" else t.cpu()))


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """The raw bytes of a contiguous CPU tensor, any dtype (bfloat16 included), without a copy."""
    assert t.is_contiguous() and t.device.type == "cpu", (t.is_contiguous(), t.device)
    return memoryview(t.reshape(-1).view(torch.uint8).numpy())  # type: ignore[arg-type]


def _none(_: memoryview) -> int:
    # The null checksum: both sides agree on 0, so verification always passes.
    return 0


CHECKSUMS: dict[str, Checksum] = {
    c.name: c
    for c in (
        Checksum("none", _none),
        Checksum("crc32", zlib.crc32),
        Checksum("adler32", zlib.adler32),
    )
}


def checksum_by_name(name: str) -> Checksum:
    """The registered checksum `name`; ValueError naming the valid ones otherwise."""
    try:
        return CHECKSUMS[name]
    except KeyError:
        raise ValueError(f"unknown checksum {name!r}; valid: {sorted(CHECKSUMS)}") from None


_POSITION = struct.Struct("<QI")


def chunk_mac(key: bytes, pull_id: int, index: int, payload: torch.Tensor) -> bytes:
    """The keyed MAC of chunk `index` of pull `pull_id`: BLAKE2b-128 keyed by the handshake's session
    key, over the pull id, the chunk index and the payload, so a chunk cannot be altered, cut short or
    moved to another position or pull without the requester noticing. A device payload is copied to
    the host first."""
    h = hashlib.blake2b(_POSITION.pack(pull_id, index), digest_size=MAC_BYTES, key=key)
    h.update(tensor_bytes(payload if payload.device.type == "cpu" else payload.cpu()))
    return h.digest()
