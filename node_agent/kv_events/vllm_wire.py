"""vLLM's KV-event wire format, written: what `vllm/distributed/kv_events.py` (main, commit 0181ea3)
puts on its ZMQ sockets, so that any indexer of vLLM events can follow a radixmesh agent.

    PUB     (topic, seq: 8-byte big-endian, payload)
    replay  a request (b"", first wanted seq: 8 bytes big-endian) on a ROUTER socket is answered with
            (b"", seq, payload) per buffered batch from that seq on, then (b"", -1 signed, b"")

`payload` is a KVEventBatch as msgspec encodes main's structs (`omit_defaults`, tagged maps): a map
{ts, events, data_parallel_rank}, each event a map led by {"type": tag}, then its fields in declaration
order, the defaulted ones only when set. The golden payload in tests/data/vllm_kv_events/
(main_map_batch.json) is reproduced byte for byte by `encode_batch`.

Block hashes. radixmesh names a block by its 16-byte chained BLAKE2b digest (proto/block_hash.py:
h0 = H(salt || tokens[0:bs]), hi = H(h(i-1) || tokens[i*bs:(i+1)*bs]), tokens little-endian int32,
keyed by the cluster's hash key, salt = tenant_salt(cache salt)). On the wire it is the unsigned 64-bit
int of its last 8 bytes, big-endian: exactly what vLLM sends for its own digests under
VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES (`int.from_bytes(digest, "big") & (2**64 - 1)`). The int only
names the block; a consumer that wants radixmesh's own digest recomputes it from the event's token ids,
block size and the cache salt (radixmesh's vLLM ingest does, cluster/fleet/ingest/block_map.py).
"""

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import msgpack

from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.events import Tier

SEQ_BYTES = 8
END_OF_REPLAY = -1
MEDIUM = {Tier.GPU: "GPU", Tier.HOST: "CPU"}
"""vLLM's medium names: MEDIUM_GPU, and "CPU" as its offloading connector names host memory."""
FULL_ATTENTION = "full_attention"
"""kv_cache_spec_kind of every radixmesh block: one full-attention KV cache group."""

WireHash = bytes | int
"""vLLM's ExternalBlockHash."""


def wire_hash(block_hash: BlockHash) -> int:
    """radixmesh's digest as vLLM's int block hash (the module docstring)."""
    return int.from_bytes(block_hash[-8:], "big")


@dataclass(frozen=True, slots=True)
class VllmBlockStored:
    block_hashes: tuple[WireHash, ...]
    parent_block_hash: WireHash | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None = None
    extra_keys: tuple[tuple[Any, ...] | None, ...] | None = None
    """Per block, what besides its tokens went into its hash: the cache salt, on a chain's first block."""
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


@dataclass(frozen=True, slots=True)
class VllmBlockRemoved:
    block_hashes: tuple[WireHash, ...]
    medium: str | None
    group_idx: int | None = None


@dataclass(frozen=True, slots=True)
class VllmAllBlocksCleared:
    pass


VllmEvent = VllmBlockStored | VllmBlockRemoved | VllmAllBlocksCleared

_REQUIRED = {"VllmBlockStored": 7, "VllmBlockRemoved": 2, "VllmAllBlocksCleared": 0}
"""Leading fields without a default in vLLM's structs: always written, None included."""


def encode_batch(ts: float, events: Sequence[VllmEvent], data_parallel_rank: int | None = 0) -> bytes:
    """One KVEventBatch payload, as vLLM main's msgspec encoder writes it."""
    batch: dict[str, Any] = {"ts": float(ts), "events": [_event(e) for e in events]}
    if data_parallel_rank is not None:
        batch["data_parallel_rank"] = data_parallel_rank
    return msgpack.packb(batch, use_bin_type=True)


def seq_frame(seq: int) -> bytes:
    """A sequence number as its frame: 8 bytes, big-endian, signed (the replay's end is -1)."""
    return seq.to_bytes(SEQ_BYTES, "big", signed=True)


def _event(e: VllmEvent) -> dict[str, Any]:
    name = type(e).__name__
    out: dict[str, Any] = {"type": name.removeprefix("Vllm")}
    for i, f in enumerate(fields(e)):
        value = getattr(e, f.name)
        if i < _REQUIRED[name] or value is not None:
            out[f.name] = value  # msgpack writes tuples as arrays
    return out
