"""One block on disk: a fixed-size header (magic, version, identity, block and parent hash, nonce,
Poly1305 tag), then the block's KV bytes. A record is served only if every field matches what the
reader expects and the keyed tag verifies, so a torn write, another model's or cluster's block and
a forged record all fail here; older versions count as corrupt. The layout, and why the tag is
keyed: docs/memory.md#disk-records.
"""

import hashlib
import hmac
import os
import struct
from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple, Protocol

from radixmesh.proto.block_hash import HASH_BYTES, BlockHash

MAGIC = b"RMKV"
VERSION = 3
HEADER_BYTES = 96
_HEAD = struct.Struct(f"<4sHHII8s8s8s{HASH_BYTES}s{HASH_BYTES}s8s")
_HAS_PARENT = 1
_NO_PARENT = bytes(HASH_BYTES)
TAG_BYTES = 16
assert _HEAD.size + TAG_BYTES == HEADER_BYTES
_RECORD_KEY_LABEL = b"radixmesh-disk-record\x00"


class Dropped(StrEnum):
    """Why a record was not served (the `reason` label of radixmesh_disk_dropped_blocks)."""

    TORN = "torn"
    """Shorter than a record: a write cut off (the file ends inside it)."""
    CORRUPT = "corrupt"
    """Bad magic or version, or the tag does not verify: damaged, or forged without the key."""
    FOREIGN = "foreign"
    """Intact, but another model's, layout's or hash key's block, or not the hash asked for."""


class Layout(Protocol):
    """What an identity needs of a proto.kv_layout.KVLayout (named by what it reads, so that a process
    that only reads segments does not import torch with kv_layout)."""

    @property
    def model_id(self) -> str: ...

    @property
    def block_size(self) -> int: ...

    @property
    def block_bytes(self) -> int: ...

    def fingerprint(self) -> str: ...


@dataclass(frozen=True, slots=True)
class DiskIdentity:
    """What a record must carry to be served by this node: equal model, layout and hash key mean
    equal KV bytes for equal block hashes."""

    model_digest: bytes
    layout_fingerprint: bytes
    hash_key_id: bytes
    block_size: int
    block_bytes: int
    record_key: bytes
    """Keys each record's tag (derived from the hash key; never written)."""

    @classmethod
    def of(cls, layout: Layout, hash_key: bytes) -> "DiskIdentity":
        """The identity of `layout`'s blocks hashed under `hash_key`; the key itself is never
        written, only a one-way id of it."""
        return cls(
            model_digest=hashlib.blake2b(layout.model_id.encode(), digest_size=8).digest(),
            layout_fingerprint=bytes.fromhex(layout.fingerprint()),
            hash_key_id=hashlib.blake2b(b"radixmesh-disk-key\x00" + hash_key, digest_size=8).digest(),
            block_size=layout.block_size,
            block_bytes=layout.block_bytes,
            record_key=hmac.new(hash_key, _RECORD_KEY_LABEL, hashlib.sha256).digest(),
        )

    def __repr__(self) -> str:  # the record key stays out of logs
        return f"DiskIdentity(block_size={self.block_size}, block_bytes={self.block_bytes})"

    @property
    def record_bytes(self) -> int:
        return HEADER_BYTES + self.block_bytes


class DiskBlock(NamedTuple):
    """One block as the disk tier takes it: its hash, its KV bytes, and the hash before it in its
    chain (None at a root)."""

    block_hash: BlockHash
    payload: bytes
    parent: BlockHash | None


class Decoded(NamedTuple):
    """A record that verified: its hash, its parent, and a view of its KV bytes."""

    block_hash: BlockHash
    parent: BlockHash | None
    payload: memoryview


def encode(identity: DiskIdentity, block: DiskBlock, out: bytearray) -> None:
    """Append the record of `block` to `out`."""
    block_hash, payload, parent = block
    if (len(payload) != identity.block_bytes or len(block_hash) != HASH_BYTES
            or (parent is not None and len(parent) != HASH_BYTES)):
        raise ValueError(f"a record holds {HASH_BYTES}-byte hashes and {identity.block_bytes} bytes of KV, "
                         f"got {len(block_hash)}, {None if parent is None else len(parent)} and {len(payload)}")
    head = _HEAD.pack(MAGIC, VERSION, 0 if parent is None else _HAS_PARENT, identity.block_size, len(payload),
                      identity.model_digest, identity.layout_fingerprint, identity.hash_key_id, block_hash,
                      _NO_PARENT if parent is None else parent, os.urandom(8))
    out += head
    out += _tag(identity, head, memoryview(payload))
    out += payload


def decode(identity: DiskIdentity, record: bytes | memoryview) -> Decoded | Dropped:
    """The hash, parent and payload view of a whole record that verifies against `identity`, else why not."""
    view = memoryview(record)
    if len(view) < identity.record_bytes:
        return Dropped.TORN
    return verify(identity, view[:HEADER_BYTES], view[HEADER_BYTES: identity.record_bytes])


def verify(identity: DiskIdentity, head: memoryview, payload: memoryview) -> Decoded | Dropped:
    """`decode` of a record read into two buffers: its HEADER_BYTES of header and its
    identity.block_bytes of payload (a read that scatters each payload straight to where it is used)."""
    magic, version, flags, block_size, length, model, layout, key, block_hash, parent, _ = _HEAD.unpack(head[: _HEAD.size])
    if magic != MAGIC or version != VERSION or flags & ~_HAS_PARENT:
        return Dropped.CORRUPT
    if (block_size, length, model, layout, key) != (identity.block_size, identity.block_bytes,
                                                   identity.model_digest, identity.layout_fingerprint,
                                                   identity.hash_key_id):
        # Another cluster's block cannot verify under our key: intact or not, it is foreign to us.
        return Dropped.FOREIGN
    if not _tag_ok(identity, head, payload):
        return Dropped.CORRUPT
    return Decoded(BlockHash(bytes(block_hash)), BlockHash(bytes(parent)) if flags & _HAS_PARENT else None, payload)


# cryptography is imported where a record is sealed or opened, not with the module: the engine
# imports the disk tier's types on every node, and the GPU check's box runs the engine without the
# cryptography wheel (bench/gpu_check.py carries only pure-Python ones).
def _tag(identity: DiskIdentity, head: bytes | memoryview, payload: memoryview) -> bytes:
    from cryptography.hazmat.primitives.poly1305 import Poly1305

    one_time = hmac.new(identity.record_key, head[: _HEAD.size], hashlib.sha256).digest()
    return Poly1305.generate_tag(one_time, payload)


def _tag_ok(identity: DiskIdentity, head: memoryview, payload: memoryview) -> bool:
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.poly1305 import Poly1305

    one_time = hmac.new(identity.record_key, head[: _HEAD.size], hashlib.sha256).digest()
    try:
        Poly1305.verify_tag(one_time, payload, bytes(head[_HEAD.size: HEADER_BYTES]))
    except InvalidSignature:
        return False
    return True
