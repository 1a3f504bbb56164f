"""Block-hash spec vectors (docs/architecture.md, "Block hashes"): pinned hex digests, recomputed here from the spec
with hashlib and struct only, so both the implementation and the published table are checked."""

import hashlib
import struct

import pytest

from radixmesh.proto.block_hash import BlockHash, hash_blocks, tenant_salt

ACME = "a3766a565e584aefe956db2e78559a46"  # tenant_salt("acme")

# (tokens, block_size, salt hex, key, expected digests hex) -- the docs table, row for row.
VECTORS = [
    (list(range(16)), 16, "", b"", ["1b0cd756b8a49da656091d1fcc620279"]),
    (
        list(range(40)),
        16,
        "",
        b"",
        ["1b0cd756b8a49da656091d1fcc620279", "23c42dc62d8010a50554cd07c5d1c92d"],
    ),
    (
        [1, 2, 3, 4, 5, 6, 7, 8],
        4,
        "",
        b"",
        ["5c3887ef44b86da26265cb5c108a056b", "1664ccca28a32287142c2088ea54ac27"],
    ),
    (list(range(16)), 16, ACME, b"", ["6578b6216ed26e2e0a3cd627d10383e6"]),
    (list(range(16)), 16, "", b"cluster-secret", ["2dfdcc32774e4c68238e691a7174fede"]),
    (
        [2**31 - 1, 0, 65536, 7],
        2,
        "",
        b"",
        ["9cb09c15e8d1e0cfbf736d9ac5058ee4", "a22123bc6838342f18108b48c4784c73"],
    ),
]


def spec_hashes(tokens: list[int], bs: int, salt: bytes, key: bytes) -> list[str]:
    """The spec, written out: h0 = H(salt || block0), hi = H(h(i-1) || block i), int32 little-endian."""
    prev = salt
    out = []
    for i in range(len(tokens) // bs):
        block = struct.pack(f"<{bs}i", *tokens[i * bs : (i + 1) * bs])
        prev = hashlib.blake2b(prev + block, digest_size=16, key=key).digest()
        out.append(prev.hex())
    return out


@pytest.mark.parametrize(("tokens", "bs", "salt", "key", "expected"), VECTORS)
def test_vectors_match_the_spec_and_the_implementation(
    tokens: list[int], bs: int, salt: str, key: bytes, expected: list[str]
) -> None:
    assert spec_hashes(tokens, bs, bytes.fromhex(salt), key) == expected
    got = hash_blocks(tokens, bs, salt=bytes.fromhex(salt), key=key)
    assert [h.hex() for h in got] == expected


def test_tenant_salt_is_blake2b_of_the_domain_and_name() -> None:
    assert tenant_salt("acme").hex() == ACME
    assert hashlib.blake2b(b"radixmesh-tenant\x00acme", digest_size=16).hexdigest() == ACME
    assert tenant_salt(None) == b"" and tenant_salt("") == b""


def test_partial_trailing_block_is_not_hashed() -> None:
    assert hash_blocks(list(range(15)), 16) == []
    assert hash_blocks(list(range(31)), 16) == hash_blocks(list(range(16)), 16)


def test_parent_continues_a_chain() -> None:
    whole = hash_blocks(list(range(48)), 16, salt=bytes.fromhex(ACME))
    tail = hash_blocks(list(range(16, 48)), 16, parent=whole[0])
    assert tail == whole[1:]


def test_salt_and_key_separate_prefix_spaces() -> None:
    base = hash_blocks(list(range(16)), 16)
    assert hash_blocks(list(range(16)), 16, salt=tenant_salt("other")) != base
    assert hash_blocks(list(range(16)), 16, key=b"k") != base
    assert all(isinstance(h, bytes) and len(h) == 16 for h in base)
    assert BlockHash(base[0]) == base[0]


def test_bad_block_size_and_key_are_rejected() -> None:
    with pytest.raises(ValueError, match="block_size"):
        hash_blocks([1, 2], 0)
    with pytest.raises(ValueError, match="64 bytes"):
        hash_blocks([1, 2], 1, key=b"x" * 65)
