"""Transfer messages, chunk plans, checksums and per-peer stats: pure units, no network."""

import asyncio

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixmesh.node_agent.transfer.checksum import CHECKSUMS, checksum_by_name, tensor_bytes
from radixmesh.node_agent.transfer.protocol import (
    ChunkTrailer,
    Kind,
    ProtocolError,
    PullHeader,
    PullRequest,
    Status,
    chunk_plan,
    decode_header,
    decode_request,
    decode_trailer,
    encode_header,
    encode_request,
    encode_trailer,
    payload_tag,
    read_frame,
)
from radixmesh.node_agent.transfer.stats import PeerStats
from radixmesh.proto.block_hash import BlockHash

hashes = st.lists(st.binary(min_size=16, max_size=16).map(BlockHash), max_size=20).map(tuple)
u32 = st.integers(0, 2**32 - 1)
u64 = st.integers(0, 2**64 - 1)


@settings(max_examples=60, deadline=None)
@given(pull_id=u64, fp=st.text(max_size=20), hs=hashes, max_blocks=u32,
       chunk=u64, checksum=st.sampled_from(sorted(CHECKSUMS)), mac=st.booleans(), follow_ms=u32)
def test_request_round_trips(pull_id: int, fp: str, hs: tuple[BlockHash, ...], max_blocks: int,
                             chunk: int, checksum: str, mac: bool, follow_ms: int) -> None:
    r = PullRequest(pull_id, fp, hs, max_blocks, chunk, checksum, mac, follow_ms)
    assert decode_request(encode_request(r)) == r


@settings(max_examples=60, deadline=None)
@given(pull_id=u64, status=st.sampled_from(list(Status)), found=u32, fp=st.text(max_size=20),
       block_bytes=st.integers(1, 2**40), chunk_blocks=st.integers(1, 2**32 - 1), msg=st.text(max_size=50))
def test_header_round_trips(pull_id: int, status: Status, found: int, fp: str, block_bytes: int,
                            chunk_blocks: int, msg: str) -> None:
    h = PullHeader(pull_id, status, found, fp, block_bytes, chunk_blocks, msg)
    assert decode_header(encode_header(h)) == h


def test_trailer_round_trips() -> None:
    t = ChunkTrailer(7, 3, 4096, 0xDEADBEEF, bytes(range(16)))
    assert decode_trailer(encode_trailer(t)) == t


@settings(max_examples=60, deadline=None)
@given(data=st.binary(max_size=200))
def test_garbage_never_decodes_silently(data: bytes) -> None:
    # Either it is a well-formed message that re-encodes to the same bytes, or ProtocolError.
    for decode, encode in ((decode_request, encode_request), (decode_header, encode_header)):
        try:
            msg = decode(data)
        except ProtocolError:
            continue
        assert encode(msg) == data  # type: ignore[operator]


def test_truncated_request_is_a_protocol_error() -> None:
    raw = encode_request(PullRequest(1, "fp", (BlockHash(b"x" * 16),), 1, 1024, "crc32"))
    with pytest.raises(ProtocolError, match="head announces"):
        decode_request(raw[:-1])
    with pytest.raises(ProtocolError, match="shorter than"):
        decode_request(raw[:5])


def test_unknown_status_is_a_protocol_error() -> None:
    raw = bytearray(encode_header(PullHeader(1, Status.OK, 0, "", 8, 1)))
    raw[8] = 200
    with pytest.raises(ProtocolError, match="unknown status 200"):
        decode_header(bytes(raw))


def test_hash_of_wrong_length_is_refused_before_encoding() -> None:
    with pytest.raises(ValueError, match="16 bytes"):
        encode_request(PullRequest(1, "fp", (BlockHash(b"short"),), 1, 1, "crc32"))


def test_read_frame_refuses_other_kind_and_oversized() -> None:
    async def read(raw: bytes, kind: Kind) -> bytes:
        reader = asyncio.StreamReader()
        reader.feed_data(raw)
        reader.feed_eof()
        return await read_frame(reader, kind)

    assert asyncio.run(read(b"\x02\x00\x00\x00\x05ab", Kind.TRAILER)) == b"ab"
    with pytest.raises(ProtocolError, match="expected a HEADER"):
        asyncio.run(read(b"\x00\x00\x00\x00\x05", Kind.HEADER))
    with pytest.raises(ProtocolError, match="exceeds"):
        asyncio.run(read(b"\xff\xff\xff\xff\x05", Kind.HEADER))
    with pytest.raises(EOFError):
        asyncio.run(read(b"\x09\x00\x00\x00\x05ab", Kind.TRAILER))


@given(found=st.integers(0, 500), chunk=st.integers(1, 64))
def test_chunk_plan_tiles_the_blocks_in_order(found: int, chunk: int) -> None:
    plan = chunk_plan(found, chunk)
    covered = [b for start, n in plan for b in range(start, start + n)]
    assert covered == list(range(found))
    assert all(1 <= n <= chunk for _, n in plan) and len(plan) == -(-found // chunk)


def test_chunk_plan_example_and_bad_size() -> None:
    assert chunk_plan(7, 3) == [(0, 3), (3, 3), (6, 1)]
    with pytest.raises(ValueError, match="chunk_blocks must be positive"):
        chunk_plan(7, 0)


def test_payload_tags_are_distinct_per_pull_and_chunk() -> None:
    tags = {payload_tag(p, i) for p in range(1, 50) for i in range(100)}
    assert len(tags) == 49 * 100 and all(0 <= t < 2**64 for t in tags)


def test_checksums_detect_a_flipped_bit_and_null_object_does_not() -> None:
    t = torch.arange(64, dtype=torch.float32)
    u = t.clone()
    u.view(torch.uint8)[5] ^= 1
    for name in ("crc32", "adler32"):
        c = checksum_by_name(name)
        assert c.of_tensor(t) != c.of_tensor(u)
    assert checksum_by_name("none").of_tensor(t) == checksum_by_name("none").of_tensor(u) == 0
    with pytest.raises(ValueError, match="valid: \\['adler32', 'crc32', 'none'\\]"):
        checksum_by_name("md5")


def test_tensor_bytes_views_bfloat16_without_copy() -> None:
    t = torch.ones(4, dtype=torch.bfloat16)
    view = tensor_bytes(t)
    assert view.nbytes == 8 and bytes(view) == b"\x80\x3f" * 4


def test_peer_stats_ewma_is_exact() -> None:
    s = PeerStats("ucx", alpha=0.5)
    s.record("ok", 2, 2_000_000_000, 1.010, 0.010)  # 2 GB/s after a 10 ms header
    s.record("ok", 1, 1_000_000_000, 1.030, 0.030)  # 1 GB/s after 30 ms
    s.record("timeout", 0, 0, 5.0, 0.0)  # no header: 5 s of fixed cost, no payload
    assert (s.pulls, s.blocks, s.bytes, s.seconds) == (3, 3, 3_000_000_000, pytest.approx(7.04))
    assert s.ewma_gbps == pytest.approx(1.5)  # payload rate only; a pull that moved nothing leaves it alone
    assert s.ewma_latency_s == pytest.approx(0.5 * (0.5 * 0.010 + 0.5 * 0.030) + 0.5 * 5.0)
    assert s.outcomes == {"ok": 2, "timeout": 1}
