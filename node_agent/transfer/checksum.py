"""Payload integrity for KV transfers: checksums chosen by name from a registry, and the keyed chunk MAC.

The checksum guards against a peer that sends the wrong bytes (a bug, a torn buffer, a corrupted
link), not against an attacker: the handshake authenticates the peer, and the keyed chunk MAC
(`chunk_mac`, PullConfig.mac) is what an attacker on the path cannot forge. TCP and RDMA
links carry their own CRCs, so the default is decided by what the checksum costs relative to the
transfer; bench/transfer.py measures both in one run.
"""

import hashlib
import hmac
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
from cryptography.hazmat.primitives.poly1305 import Poly1305

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


OFF_LOOP_BYTES = 1 << 20
"""Chunks at least this large are checksummed and MAC'd on a worker thread, by the owner and by the
requester: a thread hop costs ~0.1 ms on a busy core, Poly1305 ~0.08 ms per MiB, and a 16 MiB chunk
handled on the event loop would stall the UCX progress of the chunk in flight for its ~1.3 ms."""
_INDEX = struct.Struct("<I")


def chunk_mac(pull_key: bytes, index: int, payload: torch.Tensor) -> bytes:
    """The MAC of chunk `index` of the pull keyed by `pull_key` (binding.BoundPull.chunk_key, bound to
    the session and to the request's digest): Poly1305 under a one-time key HMAC-SHA256(pull_key,
    index), RFC 8439's construction with HMAC in place of ChaCha20. A chunk cannot be altered, cut
    short, moved to another position or pull, or answer another request without the requester
    noticing. A device payload is copied to the host first.

    Why Poly1305: 12.6 GiB/s on one core of the 2-core bench machine, where keyed BLAKE2b ran at 1.2
    and HMAC-SHA256 (SHA-NI) at 1.75; a 16 MiB chunk costs ~1.3 ms. Its key must never MAC two
    messages: every pull's key is distinct (its digest counts the session's requests) and the index
    makes one key per chunk."""
    one_time = hmac.new(pull_key, _INDEX.pack(index), hashlib.sha256).digest()
    return Poly1305.generate_tag(one_time, tensor_bytes(payload if payload.device.type == "cpu" else payload.cpu()))
