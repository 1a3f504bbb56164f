"""Chained block hashes: the identity of a prefix block across the whole cluster.

Spec (docs/architecture.md, "Block hashes", has test vectors; other engines can match it)::

    h0 = H(salt ‖ tokens[0:bs])
    hi = H(h(i-1) ‖ tokens[i*bs:(i+1)*bs])

H is BLAKE2b with a 16-byte digest, keyed by the cluster's hash key when one is set; tokens are
little-endian int32. Only full blocks are hashed: a trailing partial block is never shared.
The chain makes a hash name its whole prefix, so equal hashes at equal positions mean equal prefixes.
"""

import hashlib
from collections.abc import Sequence
from typing import NewType

import numpy as np

BlockHash = NewType("BlockHash", bytes)
"""16-byte chained digest of one full block and every block before it."""

HASH_BYTES = 16
MAX_KEY_BYTES = 64
"""BLAKE2b's longest key."""
_TENANT_DOMAIN = b"radixmesh-tenant\x00"


def tenant_salt(tenant: str | None) -> bytes:
    """Salt for a tenant name; the empty tenant shares the public (unsalted) prefix space.

    Hashing the name (instead of using its bytes) keeps every salt 16 bytes long and makes it
    infeasible for a tenant to pick a name whose salt equals someone else's chain hash.
    """
    if not tenant:
        return b""
    return hashlib.blake2b(_TENANT_DOMAIN + tenant.encode("utf-8"), digest_size=HASH_BYTES).digest()


def hash_blocks(
    tokens: Sequence[int] | np.ndarray,
    block_size: int,
    *,
    salt: bytes = b"",
    key: bytes = b"",
    parent: BlockHash | None = None,
) -> list[BlockHash]:
    """Hashes of every full block of `tokens`.

    `parent` continues an existing chain (the hash of the block just before `tokens[0]`); it
    replaces the salt, which only enters the first block of a sequence.
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    if len(key) > MAX_KEY_BYTES:
        raise ValueError(f"hash key is at most {MAX_KEY_BYTES} bytes, got {len(key)}")
    n_full = len(tokens) // block_size
    if n_full == 0:
        return []
    raw = np.asarray(tokens[: n_full * block_size], dtype="<i4").tobytes()
    step = block_size * 4
    prev: bytes = parent if parent is not None else salt
    out: list[BlockHash] = []
    for start in range(0, len(raw), step):
        h = hashlib.blake2b(prev, digest_size=HASH_BYTES, key=key)
        h.update(raw[start : start + step])
        prev = h.digest()
        out.append(BlockHash(prev))
    return out
