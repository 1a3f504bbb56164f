"""Mooncake-format request traces: reading them, and turning hash ids into real tokens and blocks.

A trace line (see tests/data/traces/README.md)::

    {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, ..., 2354]}

`timestamp` is milliseconds from the trace start; each hash id names one 512-token block and (being
a remapped chained hash) the whole prefix before it. We map a hash id to a deterministic run of
`tokens_per_block` token ids, so equal ids give equal tokens, and the chained radixmesh block hashes
of those tokens (block_size = tokens_per_block) give one cache block per trace block. Every trace
block, the usually partial last one included, becomes one full block: that is how the trace's own
cache ratio counts them.
"""

import hashlib
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from radixmesh.proto.block_hash import BlockHash, hash_blocks

TRACE_BLOCK_TOKENS = 512
"""Tokens per hash id in Mooncake traces: `len(hash_ids) == ceil(input_length / 512)`."""

_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace, arrival already divided by the speed-up."""

    arrival_s: float
    input_length: int
    """Prompt tokens in the original trace (drives prefill time)."""
    output_length: int
    hash_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class TokenMapping:
    """How hash ids become tokens: `tokens_per_block` ids in [0, vocab_size) per trace block."""

    tokens_per_block: int = 16
    """Tokens each hash id expands to; small keeps CPU replays cheap, one radixmesh block each."""
    vocab_size: int = 32000

    def __post_init__(self) -> None:
        if self.tokens_per_block < 1:
            raise ValueError(f"tokens_per_block must be >= 1, got {self.tokens_per_block}")
        if not 2 <= self.vocab_size <= 2**31:
            raise ValueError(f"vocab_size must be in [2, 2**31], got {self.vocab_size}")

    def block_tokens(self, hash_id: int) -> list[int]:
        """The tokens of one trace block; a pure function of (hash_id, this mapping)."""
        key = hash_id.to_bytes(8, "little", signed=True)
        # Counter-mode BLAKE2b: 16 uint32 per 64-byte digest, as many digests as the block needs.
        raw = b"".join(
            hashlib.blake2b(key + c.to_bytes(4, "little"), digest_size=64, person=b"radixmesh-trace").digest()
            for c in range(-(-self.tokens_per_block // 16))
        )
        words = np.frombuffer(raw, dtype="<u4")[: self.tokens_per_block]
        return (words % self.vocab_size).tolist()

    def tokens(self, request: TraceRequest) -> list[int]:
        """The prompt: each hash id's block tokens, concatenated in order."""
        out: list[int] = []
        for h in request.hash_ids:
            out.extend(self.block_tokens(h))
        return out

    def hashes(self, request: TraceRequest) -> list[BlockHash]:
        """Chained block hashes of the prompt, one per trace block."""
        return hash_blocks(self.tokens(request), self.tokens_per_block)


def parse_line(line: str, *, where: str = "line") -> tuple[float, int, int, tuple[int, ...]]:
    """(timestamp_ms, input_length, output_length, hash_ids) of one JSON line; ValueError if malformed."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not JSON ({e.msg})") from None
    if not isinstance(obj, dict) or any(k not in obj for k in _FIELDS):
        raise ValueError(f"{where}: needs the fields {', '.join(_FIELDS)}")
    ts, inp, outp, ids = (obj[k] for k in _FIELDS)
    if not isinstance(ts, int | float) or isinstance(ts, bool) or not math.isfinite(ts) or ts < 0:
        raise ValueError(f"{where}: timestamp must be a finite number >= 0, got {ts!r}")
    for name, v in (("input_length", inp), ("output_length", outp)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ValueError(f"{where}: {name} must be an integer >= 0, got {v!r}")
    if not isinstance(ids, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in ids):
        raise ValueError(f"{where}: hash_ids must be a list of integers")
    if len(ids) != math.ceil(inp / TRACE_BLOCK_TOKENS):
        raise ValueError(f"{where}: {len(ids)} hash_ids for input_length {inp} (512-token blocks)")
    return float(ts), inp, outp, tuple(ids)


def iter_trace(path: str | Path, *, speedup: float = 1.0, limit: int | None = None) -> Iterator[TraceRequest]:
    """Requests of a Mooncake JSONL file in file order, arrival = timestamp / 1000 / speedup.

    Blank lines are skipped. Raises ValueError naming the line for a malformed line or an arrival
    earlier than the one before (replay order is arrival order), and for a bad speedup or limit.
    """
    if not (math.isfinite(speedup) and speedup > 0):
        raise ValueError(f"speedup must be a finite number > 0, got {speedup}")
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    count = 0
    last = 0.0
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if limit is not None and count >= limit:
                return
            if not line.strip():
                continue
            ts, inp, outp, ids = parse_line(line, where=f"{path}:{lineno}")
            if ts < last:
                raise ValueError(f"{path}:{lineno}: timestamp {ts} is before the previous one ({last})")
            last = ts
            count += 1
            yield TraceRequest(ts / 1000.0 / speedup, inp, outp, ids)


def read_trace(path: str | Path, *, speedup: float = 1.0, limit: int | None = None) -> list[TraceRequest]:
    """All of `iter_trace` as a list (the first `limit` requests when given)."""
    return list(iter_trace(path, speedup=speedup, limit=limit))
