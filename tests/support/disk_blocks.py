"""The disk tier tests' blocks and stores: a tiny layout whose block i has bytes that are a function of
i, so a wrong block is told from a right one, and stores of a few 4-record segments."""

from pathlib import Path

from radixmesh.node_agent.memory.disk.record import DiskBlock, DiskIdentity
from radixmesh.node_agent.memory.disk.segments import SegmentStore
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.kv_layout import KVLayout

LAYOUT = KVLayout("tiny-test", num_layers=1, num_kv_heads=1, head_dim=2, dtype="float32", block_size=4)
IDENTITY = DiskIdentity.of(LAYOUT, b"cluster-key")
BLOCK = LAYOUT.block_bytes  # 64 bytes of KV, 144 with the header
RECORD = IDENTITY.record_bytes
PER_SEGMENT = 4
BIG = KVLayout("tiny-test", num_layers=4, num_kv_heads=2, head_dim=64, dtype="float32", block_size=16)
"""64 KiB blocks, for the kill test's large writes."""


def h(i: int) -> BlockHash:
    return BlockHash(i.to_bytes(16, "little"))


def kv(i: int, size: int = BLOCK) -> bytes:
    """The block of h(i): its bytes are a function of i, so a wrong block is told from a right one."""
    return (i.to_bytes(8, "little") * (size // 8 + 1))[:size]


def blk(i: int) -> DiskBlock:
    """Block i of one chain: h(i) under h(i - 1)."""
    return DiskBlock(h(i), kv(i), h(i - 1) if i else None)


def store(path: Path, segments: int = 4, identity: DiskIdentity = IDENTITY) -> SegmentStore:
    return SegmentStore(path, identity, capacity_bytes=segments * PER_SEGMENT * RECORD,
                        segment_bytes=PER_SEGMENT * RECORD)


def served(s: SegmentStore) -> dict[BlockHash, memoryview]:
    """Everything `s` serves; asserts each block is the one written under its hash."""
    got = {b: s.get(b) for b in s.hashes()}
    for b, payload in got.items():
        assert payload == kv(int.from_bytes(b, "little"), s.identity.block_bytes), b
    return {b: p for b, p in got.items() if p is not None}
