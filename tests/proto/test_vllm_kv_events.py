"""vLLM's KV-event wire (proto/vllm_kv_events.py): golden frames from vLLM's own publisher decoded,
vLLM main's golden payload encoded byte for byte, malformed input refused, and every event type and
frame round-tripped."""


import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.vllm_kv_events import (
    END_OF_REPLAY,
    FULL_ATTENTION,
    REPLAY_END,
    EventDecodeError,
    VllmAllBlocksCleared,
    VllmBlockRemoved,
    VllmBlockStored,
    VllmEventBatch,
    decode_batch,
    decode_pub,
    decode_replay,
    decode_replay_request,
    decode_seq,
    encode_batch,
    pub_frames,
    replay_frames,
    replay_request,
    seq_frame,
    wire_hash,
)

MAIN_BATCH = VllmEventBatch(1700000100.5, (
    VllmBlockStored((b"\x0b" * 32, b"\x0c" * 32), None, tuple(range(8)), 4, None, "GPU", None, (("tenant-a",), None),
                    0, FULL_ATTENTION),
    VllmBlockStored((b"\x0d" * 32,), None, (5, 6, 7, 8), 4, None, "GPU", None, ((["img-1", 0],),)),
    VllmBlockRemoved((b"\x0c" * 32,), "GPU", 0),
    VllmAllBlocksCleared(),
), 0)
"""main_map_batch.json, decoded (msgpack reads the multimodal key's inner array back as a list)."""
from tests.support.vllm_golden import MAIN_PAYLOAD, PUB, REPLAY


def h(i: int) -> bytes:
    return bytes([i]) * 32


# --- golden bytes -------------------------------------------------------------------------------
def test_decodes_the_frames_of_vllm_0_11_publisher() -> None:
    assert [f[0] for f in PUB] == [b"kv-events"] * 5
    assert [decode_pub(f).seq for f in PUB] == [0, 1, 2, 3, 4]
    batches = [decode_batch(decode_pub(f).payload) for f in PUB]
    assert batches == [
        VllmEventBatch(1700000000.0, (VllmBlockStored((h(1), h(2)), None, tuple(range(8)), 4, None, "GPU"),), 0),
        VllmEventBatch(1700000001.0, (VllmBlockStored((h(3),), h(2), (8, 9, 10, 11), 4, None, "GPU"),
                                      VllmBlockStored((h(4),), None, (100, 101, 102, 103), 4, None, "CPU")), 0),
        VllmEventBatch(1700000002.0, (VllmBlockRemoved((h(3),), "GPU"),), 0),
        VllmEventBatch(1700000003.0, (VllmAllBlocksCleared(),), 0),
        VllmEventBatch(1700000004.0, (VllmBlockStored((12345678901234,), None, (0, 1, 2, 3), 4, 7, None),), 0),
    ]


def test_decodes_vllm_replay_frames() -> None:
    # A DEALER receives (b"", seq, payload) per batch from seq 1 on, then (b"", -1, b"").
    assert [decode_replay(f).seq for f in REPLAY] == [1, 2, 3, 4, END_OF_REPLAY]
    assert REPLAY[-1] == list(REPLAY_END)
    assert [decode_replay(f).payload for f in REPLAY[:-1]] == [f[2] for f in PUB[1:]]


def test_sequence_frames_are_vllms() -> None:
    assert [seq_frame(i) for i in range(5)] == [f[1] for f in PUB]
    assert [pub_frames("kv-events", 1, f[2]) for f in PUB[1:2]] == [tuple(PUB[1])]


def test_decodes_the_map_encoding_of_vllm_main() -> None:
    assert decode_batch(MAIN_PAYLOAD) == MAIN_BATCH


def test_the_encoder_writes_vllm_mains_golden_payload_byte_for_byte() -> None:
    assert encode_batch(MAIN_BATCH) == MAIN_PAYLOAD


def test_block_hashes_go_out_as_vllms_int_hashes() -> None:
    # vLLM: int.from_bytes(digest, "big") & (2**64 - 1), the last 8 bytes, unsigned.
    assert wire_hash(BlockHash(bytes(range(16)))) == 0x08090A0B0C0D0E0F
    assert wire_hash(BlockHash(b"\xff" * 16)) == 2**64 - 1


# --- malformed input ----------------------------------------------------------------------------
@pytest.mark.parametrize("payload", [
    b"\xc1",  # not msgpack
    msgpack.packb("batch"),
    msgpack.packb([1.0]),
    msgpack.packb([1.0, [["BlockEvicted", [b"x"]]]]),
    msgpack.packb([1.0, [["BlockStored", [b"x"], None, [1, 2], 2, None, "GPU", None, [None, None]]]]),
    msgpack.packb([1.0, [["BlockStored", [b"x"], None, [1, 2]]]]),
    msgpack.packb([1.0, [["BlockStored", [1.5], None, [1, 2], 2]]]),
    msgpack.packb([1.0, [["BlockStored", [b"x"], None, [1, "2"], 2]]]),
    msgpack.packb([1.0, [["BlockStored", [b"x"], None, [1, 2], 0]]]),
    msgpack.packb([1.0, [["BlockRemoved", [b"x"], "GPU", None, "extra"]]]),
    msgpack.packb({"ts": 1.0, "events": [{"block_hashes": []}]}),
    msgpack.packb({"ts": "now", "events": []}),
])
def test_malformed_payloads_are_refused(payload: bytes) -> None:
    with pytest.raises(EventDecodeError):
        decode_batch(payload)


@pytest.mark.parametrize("frames", [[b"t", seq_frame(0)], [b"t", b"\x00", b""], [b"t", seq_frame(0), b"", b""]])
def test_a_pub_message_that_is_not_topic_seq_payload_is_refused(frames: list[bytes]) -> None:
    with pytest.raises(EventDecodeError):
        decode_pub(frames)


@pytest.mark.parametrize("frames", [[seq_frame(0)], [b"x", seq_frame(0)], [b"", b"\x00" * 4], [b"", seq_frame(0), b""]])
def test_a_replay_request_that_is_not_delimiter_and_seq_is_refused(frames: list[bytes]) -> None:
    with pytest.raises(EventDecodeError):
        decode_replay_request(frames)


@given(st.binary(max_size=64))
def test_any_bytes_decode_or_raise_decode_error(payload: bytes) -> None:
    try:
        batch = decode_batch(payload)
    except EventDecodeError:
        return
    assert isinstance(batch, VllmEventBatch)


# --- round trips --------------------------------------------------------------------------------
u64 = st.integers(0, 2**64 - 1)
engine_hash = st.one_of(st.binary(min_size=1, max_size=32), u64)
opt_int = st.none() | st.integers(-(2**63), 2**64 - 1)
opt_str = st.none() | st.text(max_size=8)
key_part = st.one_of(st.none(), st.text(max_size=8), st.binary(max_size=8), st.integers(-(2**63), 2**64 - 1))


@st.composite
def stored(draw: st.DrawFn) -> VllmBlockStored:
    hashes = tuple(draw(st.lists(engine_hash, max_size=4)))
    block_size = draw(st.integers(1, 2**32))
    keys = st.none() | st.tuples(*[st.none() | st.tuples(key_part) for _ in hashes])
    return VllmBlockStored(
        hashes, draw(st.none() | engine_hash), tuple(draw(st.lists(st.integers(-(2**63), 2**64 - 1), max_size=8))),
        block_size, draw(opt_int), draw(opt_str), draw(opt_str), draw(keys), draw(opt_int), draw(opt_str),
        draw(opt_int), draw(opt_str))


events = st.one_of(
    stored(),
    st.builds(VllmBlockRemoved, st.lists(engine_hash, max_size=4).map(tuple), opt_str, opt_int),
    st.just(VllmAllBlocksCleared()),
)
batches = st.builds(VllmEventBatch, st.floats(allow_nan=False), st.lists(events, max_size=4).map(tuple), opt_int)


@given(batches)
def test_every_batch_decodes_to_what_was_encoded(batch: VllmEventBatch) -> None:
    assert decode_batch(encode_batch(batch)) == batch


@given(st.text(max_size=8), st.integers(-(2**63), 2**63 - 1), st.binary(max_size=16), u64)
def test_every_frame_decodes_to_what_was_framed(topic: str, seq: int, payload: bytes, start: int) -> None:
    assert decode_seq(seq_frame(seq)) == seq
    assert decode_pub(pub_frames(topic, seq, payload)) == (seq, payload)
    assert decode_replay(replay_frames(seq, payload)) == (seq, payload)
    assert decode_replay(replay_frames(seq, payload)[1:]) == (seq, payload)  # a peer that leaves out the delimiter
    assert decode_replay_request(replay_request(start)) == start
