"""vLLM's KV-event wire, both ways: the schema and framing of `vllm/distributed/kv_events.py` (read at
v0.11.0 and at main, commit 0181ea3). The agent's publisher (node_agent/kv_events) encodes with it and
the router's ingest (cluster/fleet/ingest) decodes with it; each side keeps only its sockets.

    PUB             (topic, seq, payload)      seq: 8 bytes, big-endian, signed
    replay request  (b"", first wanted seq)    8 bytes, big-endian, unsigned (as vLLM reads it)
    replay answer   (b"", seq, payload) per buffered batch from that seq on, then (b"", -1, b"")

`payload` is a KVEventBatch {ts, events, data_parallel_rank} in msgpack. Up to v0.11 (and in SGLang)
msgspec writes the structs `array_like`: a batch `[ts, events, rank]`, an event `[tag, field, ...]`
with trailing defaults left out; main writes maps (`omit_defaults`): an event `{"type": tag, field:
value, ...}`. `decode_batch` reads both and checks every field (EventDecodeError, nothing else);
`encode_batch` writes main's maps byte for byte (the golden payload in tests/data/vllm_kv_events/).
The plain `msgpack` library does both: two shapes need no schema classes.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any, NamedTuple, TypeVar

import msgpack

from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.events import Tier

SEQ_BYTES = 8
END_OF_REPLAY = -1
"""The seq of a replay answer's last message."""

EngineHash = bytes | int
"""vLLM's ExternalBlockHash (sha256 digests, or 64-bit ints under VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES):
it names a block only within the engine that sent it; a reader only compares it."""

MEDIUM = {Tier.GPU: "GPU", Tier.HOST: "CPU"}
"""What radixmesh writes per tier: vLLM's MEDIUM_GPU, and "CPU" as its offloading connector names host memory."""
MEDIUM_TIERS = {"GPU": Tier.GPU, "CPU": Tier.HOST, "CPU_PINNED": Tier.HOST}
"""What a reader understands: vLLM's names, and SGLang's for host memory (None means GPU: events from
before `medium`)."""
FULL_ATTENTION = "full_attention"
"""kv_cache_spec_kind of every radixmesh block: one full-attention KV cache group."""


class EventDecodeError(ValueError):
    """A frame or payload that is not a KVEventBatch of the schema above."""


@dataclass(frozen=True, slots=True)
class VllmBlockStored:
    """`block_hashes` (consecutive blocks of one sequence) became cached; `token_ids` holds all their
    tokens, `block_size` per block. Fields in vLLM's declaration order (the array form's positions),
    then SGLang's `cache_salt`."""

    block_hashes: tuple[EngineHash, ...]
    parent_block_hash: EngineHash | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: tuple[tuple[Any, ...] | None, ...] | None = None
    """Per block, what besides its tokens went into its hash: vLLM puts the cache salt last in a chain's first."""
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    cache_salt: str | None = None
    """SGLang's BlockStoredWithMetadata carries the request's cache_salt here (vLLM: in extra_keys)."""


@dataclass(frozen=True, slots=True)
class VllmBlockRemoved:
    block_hashes: tuple[EngineHash, ...]
    medium: str | None = None
    group_idx: int | None = None


@dataclass(frozen=True, slots=True)
class VllmAllBlocksCleared:
    """The engine dropped its whole prefix cache (reset_prefix_cache)."""


VllmEvent = VllmBlockStored | VllmBlockRemoved | VllmAllBlocksCleared


@dataclass(frozen=True, slots=True)
class VllmEventBatch:
    ts: float
    events: tuple[VllmEvent, ...]
    data_parallel_rank: int | None = None


class Numbered(NamedTuple):
    """A batch payload as a socket carries it, with its seq."""

    seq: int
    payload: bytes


_TAG = {VllmBlockStored: "BlockStored", VllmBlockRemoved: "BlockRemoved", VllmAllBlocksCleared: "AllBlocksCleared"}
_FIELDS = {tag: tuple(f.name for f in fields(cls) if f.name != "cache_salt") for cls, tag in _TAG.items()}
"""vLLM's fields per tag, in declaration order: the positions of the array form."""
_WRITTEN = {"BlockStored": 7, "BlockRemoved": 2, "AllBlocksCleared": 0}
"""Leading fields without a default in main's structs: msgspec writes them always, None included."""
_REQUIRED = {"BlockStored": 4, "BlockRemoved": 1, "AllBlocksCleared": 0}
"""Leading fields a reader insists on (vLLM <= 0.11 has no default for lora_id and medium either, but
SGLang leaves them out)."""
T = TypeVar("T")


# --- frames ---------------------------------------------------------------------------------------
def seq_frame(seq: int) -> bytes:
    """A sequence number as its frame (the replay's end is -1, hence signed)."""
    return seq.to_bytes(SEQ_BYTES, "big", signed=True)


def decode_seq(frame: bytes) -> int:
    if len(frame) != SEQ_BYTES:
        raise EventDecodeError(f"a sequence frame has {SEQ_BYTES} bytes, got {len(frame)}")
    return int.from_bytes(frame, "big", signed=True)


def pub_frames(topic: str, seq: int, payload: bytes) -> tuple[bytes, bytes, bytes]:
    return topic.encode(), seq_frame(seq), payload


def decode_pub(frames: Sequence[bytes]) -> Numbered:
    """One PUB message; the topic is the SUB socket's filter, not read here."""
    if len(frames) != 3:
        raise EventDecodeError(f"a message of {len(frames)} frames, not (topic, seq, payload)")
    return Numbered(decode_seq(frames[1]), frames[2])


def replay_request(start: int) -> tuple[bytes, bytes]:
    """What a DEALER sends: the empty frame is the REQ-style delimiter vLLM's ROUTER expects."""
    return b"", start.to_bytes(SEQ_BYTES, "big")


def decode_replay_request(frames: Sequence[bytes]) -> int:
    """A replay request as the ROUTER receives it, less the peer's identity frame."""
    if len(frames) != 2 or frames[0] != b"" or len(frames[1]) != SEQ_BYTES:
        raise EventDecodeError(f"a replay request of {len(frames)} frames, not (b'', seq)")
    return int.from_bytes(frames[1], "big")


def replay_frames(seq: int, payload: bytes) -> tuple[bytes, bytes, bytes]:
    """One message of a replay answer (the ROUTER puts the peer's identity before it)."""
    return b"", seq_frame(seq), payload


REPLAY_END = replay_frames(END_OF_REPLAY, b"")


def decode_replay(frames: Sequence[bytes]) -> Numbered:
    """One message of a replay answer, with or without its leading delimiter."""
    if frames and frames[0] == b"":
        frames = frames[1:]
    if len(frames) != 2:
        raise EventDecodeError(f"a replay message of {len(frames)} frames")
    return Numbered(decode_seq(frames[0]), frames[1])


# --- payloads -------------------------------------------------------------------------------------
def encode_batch(batch: VllmEventBatch) -> bytes:
    """One KVEventBatch payload, as vLLM main's msgspec encoder writes it."""
    out: dict[str, Any] = {"ts": float(batch.ts), "events": [_encode_event(e) for e in batch.events]}
    if batch.data_parallel_rank is not None:
        out["data_parallel_rank"] = batch.data_parallel_rank
    return msgpack.packb(out, use_bin_type=True)


def _encode_event(e: VllmEvent) -> dict[str, Any]:
    tag = _TAG[type(e)]
    out: dict[str, Any] = {"type": tag}
    for i, name in enumerate(_FIELDS[tag]):
        value = getattr(e, name)
        if i < _WRITTEN[tag] or value is not None:
            out[name] = value  # msgpack writes tuples as arrays
    if isinstance(e, VllmBlockStored) and e.cache_salt is not None:
        out["metadata"] = {"cache_salt": e.cache_salt}  # where decode_batch reads SGLang's salt in a map
    return out


def decode_batch(payload: bytes) -> VllmEventBatch:
    """One KVEventBatch payload, in either encoding (array_like or map)."""
    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False, use_list=True)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as e:
        raise EventDecodeError(f"payload is not msgpack: {e}") from e
    except TypeError as e:  # a map key that Python cannot hash: an array or a map
        raise EventDecodeError(f"payload has a map key that is not a scalar: {e}") from e
    if isinstance(raw, list):
        if not 2 <= len(raw) <= 3:
            raise EventDecodeError(f"an array batch has 2 or 3 fields, got {len(raw)}")
        ts, events, rank = (*raw, None)[:3]
    elif isinstance(raw, dict):
        ts, events, rank = raw.get("ts"), raw.get("events"), raw.get("data_parallel_rank")
    else:
        raise EventDecodeError(f"a batch is an array or a map, got {type(raw).__name__}")
    if not isinstance(ts, int | float) or isinstance(ts, bool) or not isinstance(events, list):
        raise EventDecodeError("a batch needs a numeric ts and a list of events")
    return VllmEventBatch(float(ts), tuple(_decode_event(e) for e in events), _opt(rank, _int, "data_parallel_rank"))


def _decode_event(raw: object) -> VllmEvent:
    metadata: object = None
    if isinstance(raw, list):
        if not raw or not isinstance(raw[0], str):
            raise EventDecodeError("an array event starts with its type tag")
        tag, names = raw[0], _fields(raw[0])
        if tag == "BlockStored" and len(raw) == 8 and isinstance(raw[7], dict):
            # SGLang's BlockStoredWithMetadata: its 7th field is a map, where vLLM has lora_name.
            raw, metadata = raw[:7], raw[7]
        if len(raw) - 1 > len(names):
            raise EventDecodeError(f"{tag} has at most {len(names)} fields, got {len(raw) - 1}")
        values = dict(zip(names, raw[1:], strict=False))
    elif isinstance(raw, dict):
        type_tag = raw.get("type")
        if not isinstance(type_tag, str):
            raise EventDecodeError("a map event carries its type tag under 'type'")
        tag, names = type_tag, _fields(type_tag)
        metadata = raw.get("metadata")
        # Fields added after this reader was written are skipped, as msgspec itself does.
        values = {k: v for k, v in raw.items() if k in names}
    else:
        raise EventDecodeError(f"an event is an array or a map, got {type(raw).__name__}")
    missing = [n for n in names[: _REQUIRED[tag]] if n not in values]
    if missing:
        raise EventDecodeError(f"{tag} lacks {', '.join(missing)}")
    if tag == "AllBlocksCleared":
        return VllmAllBlocksCleared()
    if tag == "BlockRemoved":
        return VllmBlockRemoved(_hashes(values["block_hashes"]), _opt(values.get("medium"), _str, "medium"),
                                _opt(values.get("group_idx"), _int, "group_idx"))
    stored = VllmBlockStored(
        block_hashes=_hashes(values["block_hashes"]),
        parent_block_hash=_opt(values["parent_block_hash"], _hash, "parent_block_hash"),
        token_ids=tuple(_int(t, "token id") for t in _list(values["token_ids"], "token_ids")),
        block_size=_int(values["block_size"], "block_size"),
        lora_id=_opt(values.get("lora_id"), _int, "lora_id"),
        medium=_opt(values.get("medium"), _str, "medium"),
        lora_name=_opt(values.get("lora_name"), _str, "lora_name"),
        extra_keys=_opt(values.get("extra_keys"), _extra_keys, "extra_keys"),
        group_idx=_opt(values.get("group_idx"), _int, "group_idx"),
        kv_cache_spec_kind=_opt(values.get("kv_cache_spec_kind"), _str, "kv_cache_spec_kind"),
        kv_cache_spec_sliding_window=_opt(values.get("kv_cache_spec_sliding_window"), _int,
                                          "kv_cache_spec_sliding_window"),
        cache_salt=_cache_salt(metadata),
    )
    if stored.block_size < 1:
        raise EventDecodeError(f"block_size must be >= 1, got {stored.block_size}")
    if stored.extra_keys is not None and len(stored.extra_keys) != len(stored.block_hashes):
        raise EventDecodeError(f"{len(stored.extra_keys)} extra keys for {len(stored.block_hashes)} blocks")
    return stored


def _cache_salt(metadata: object) -> str | None:
    if metadata is None:
        return None
    if not isinstance(metadata, dict):
        raise EventDecodeError(f"BlockStored metadata must be a map, got {type(metadata).__name__}")
    return _opt(metadata.get("cache_salt"), _str, "cache_salt")


def _fields(tag: str) -> tuple[str, ...]:
    names = _FIELDS.get(tag)
    if names is None:
        raise EventDecodeError(f"unknown event type {tag!r}")
    return names


def _opt(value: object, convert: Callable[[object, str], T], what: str) -> T | None:
    return None if value is None else convert(value, what)


def _int(value: object, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise EventDecodeError(f"{what} must be an integer, got {type(value).__name__}")
    return value


def _str(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise EventDecodeError(f"{what} must be a string, got {type(value).__name__}")
    return value


def _list(value: object, what: str) -> Sequence[object]:
    if not isinstance(value, list):
        raise EventDecodeError(f"{what} must be a list, got {type(value).__name__}")
    return value


def _hash(value: object, what: str = "block hash") -> EngineHash:
    if isinstance(value, bytes) or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise EventDecodeError(f"{what} must be bytes or an integer, got {type(value).__name__}")


def _hashes(value: object) -> tuple[EngineHash, ...]:
    return tuple(_hash(h) for h in _list(value, "block_hashes"))


def _extra_keys(value: object, what: str) -> tuple[tuple[Any, ...] | None, ...]:
    return tuple(None if k is None else tuple(_list(k, what)) for k in _list(value, what))


# --- radixmesh's blocks in vLLM's terms -------------------------------------------------------------
def wire_hash(block_hash: BlockHash) -> int:
    """radixmesh's 16-byte chained digest (proto/block_hash.py) as vLLM's int block hash: the unsigned
    64-bit int of its last 8 bytes, big-endian, exactly what vLLM sends for its own digests under
    VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES (`int.from_bytes(digest, "big") & (2**64 - 1)`). The int only
    names the block: a reader that wants radixmesh's digest recomputes it from the event's token ids,
    block size and cache salt (cluster/fleet/ingest/block_map.py does)."""
    return int.from_bytes(block_hash[-8:], "big")
