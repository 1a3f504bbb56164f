"""Block hashes for tests that need distinct, readable ones without hashing tokens (the real chained
hash of token blocks is `radixmesh.proto.block_hash.hash_blocks`)."""

from radixmesh.proto.block_hash import BlockHash


def h(i: int) -> BlockHash:
    """The i-th test hash: i's 16 bytes, little-endian (distinct for distinct i >= 0)."""
    return BlockHash(i.to_bytes(16, "little"))
