"""Decoding vLLM's KV cache events, as its ZMQ publisher sends them.

The schema is vLLM's own, `vllm/distributed/kv_events.py` (read at v0.11.0, the wheel, and at main,
commit 0181ea3): `ZmqEventPublisher` sends multipart frames

    PUB     (topic, seq: 8-byte big-endian, payload)
    replay  (seq, payload) ... then (-1 as 8-byte signed big-endian, b"") on a ROUTER socket, answering
            a request carrying the first wanted seq as 8 bytes big-endian

and `payload` is a `KVEventBatch(ts, events, data_parallel_rank)` encoded by `msgspec.msgpack`. Its
events are tagged structs: `BlockStored(block_hashes, parent_block_hash, token_ids, block_size,
lora_id, medium, lora_name, extra_keys, group_idx, kv_cache_spec_kind,
kv_cache_spec_sliding_window)`, `BlockRemoved(block_hashes, medium, group_idx)`, `AllBlocksCleared()`.
Up to v0.11 the structs are `array_like` (a batch is `[ts, events, rank]`, an event `[tag, field,
...]` with trailing defaults omitted); main encodes them as maps (`{"ts": ..., "events": [...]}`, an
event `{"type": tag, field: value, ...}`). SGLang's publisher (`sglang/srt/disaggregation/kv_events.py`)
sends the array form, with int hashes, medium "CPU_PINNED" for host memory, and for a salted request
`BlockStoredWithMetadata`: BlockStored's six fields then a map `{"cache_salt": ...}`. All forms decode
here, with the plain `msgpack` library (no schema classes needed for two shapes), and every field
is checked: malformed input raises EventDecodeError and nothing else.

Block hashes are `ExternalBlockHash = bytes | int` (sha256 digests, or 64-bit ints with
VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES); they are opaque here, only compared.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import msgpack

EngineHash = bytes | int
"""An engine's own block hash; it names a block only within that engine."""
SEQ_BYTES = 8
END_OF_REPLAY = -1
"""The seq of the replay socket's last frame."""

_STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
                  "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window")
"""BlockStored's fields in declaration order: the positions of the array form."""
_REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")
T = TypeVar("T")
_REQUIRED = {"BlockStored": 4, "BlockRemoved": 1, "AllBlocksCleared": 0}
"""Leading fields without a default (vLLM <= 0.11 also has no default for lora_id and medium, but
SGLang omits them)."""


class EventDecodeError(ValueError):
    """A frame or payload that is not a KVEventBatch of the schema above."""


@dataclass(frozen=True, slots=True)
class EngineBlockStored:
    """`block_hashes` (consecutive blocks of one sequence) became cached; `token_ids` holds all
    their tokens, `block_size` per block; `extra_keys[i]` is what besides tokens went into hash i."""

    block_hashes: tuple[EngineHash, ...]
    parent_block_hash: EngineHash | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: tuple[tuple[Any, ...] | None, ...] | None = None
    group_idx: int | None = None
    cache_salt: str | None = None
    """SGLang's BlockStoredWithMetadata carries the request's cache_salt here (vLLM: in extra_keys)."""


@dataclass(frozen=True, slots=True)
class EngineBlockRemoved:
    block_hashes: tuple[EngineHash, ...]
    medium: str | None = None
    group_idx: int | None = None


@dataclass(frozen=True, slots=True)
class EngineAllCleared:
    """The engine dropped its whole prefix cache (reset_prefix_cache)."""


EngineEvent = EngineBlockStored | EngineBlockRemoved | EngineAllCleared


@dataclass(frozen=True, slots=True)
class EngineEventBatch:
    ts: float
    events: tuple[EngineEvent, ...]
    data_parallel_rank: int | None = None


def decode_seq(frame: bytes) -> int:
    """A sequence frame: 8 bytes, big-endian, signed (the replay's end marker is -1)."""
    if len(frame) != SEQ_BYTES:
        raise EventDecodeError(f"a sequence frame has {SEQ_BYTES} bytes, got {len(frame)}")
    return int.from_bytes(frame, "big", signed=True)


def decode_batch(payload: bytes) -> EngineEventBatch:
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
    return EngineEventBatch(float(ts), tuple(_event(e) for e in events), _opt(rank, _int, "data_parallel_rank"))


def _event(raw: object) -> EngineEvent:
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
        values = {k: v for k, v in raw.items() if k != "type"}
        metadata = values.pop("metadata", None)
        # Fields added after this reader was written are skipped, as msgspec itself does.
        values = {k: v for k, v in values.items() if k in names}
    else:
        raise EventDecodeError(f"an event is an array or a map, got {type(raw).__name__}")
    missing = [n for n in names[: _REQUIRED[tag]] if n not in values]
    if missing:
        raise EventDecodeError(f"{tag} lacks {', '.join(missing)}")
    if tag == "AllBlocksCleared":
        return EngineAllCleared()
    if tag == "BlockRemoved":
        return EngineBlockRemoved(_hashes(values["block_hashes"]), _opt(values.get("medium"), _str, "medium"),
                                  _opt(values.get("group_idx"), _int, "group_idx"))
    stored = EngineBlockStored(
        block_hashes=_hashes(values["block_hashes"]),
        parent_block_hash=_opt(values["parent_block_hash"], _hash, "parent_block_hash"),
        token_ids=tuple(_int(t, "token id") for t in _list(values["token_ids"], "token_ids")),
        block_size=_int(values["block_size"], "block_size"),
        lora_id=_opt(values.get("lora_id"), _int, "lora_id"),
        medium=_opt(values.get("medium"), _str, "medium"),
        lora_name=_opt(values.get("lora_name"), _str, "lora_name"),
        extra_keys=_opt(values.get("extra_keys"), _extra_keys, "extra_keys"),
        group_idx=_opt(values.get("group_idx"), _int, "group_idx"),
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
    if tag == "BlockStored":
        return _STORED_FIELDS
    if tag == "BlockRemoved":
        return _REMOVED_FIELDS
    if tag == "AllBlocksCleared":
        return ()
    raise EventDecodeError(f"unknown event type {tag!r}")


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
