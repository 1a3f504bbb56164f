"""A seeded bench workload as a Mooncake trace, so the simulator replays the bench's sessions.

The requests are the bench's own (`open_loop`), each one trace line::

    {"timestamp": arrival ms, "input_length": len(prompt), "output_length": max_tokens,
     "hash_ids": [one id per block of the prompt]}

The prompt is cut into `block_tokens`-token blocks, the partial last one a block too (as Mooncake)::

    prompt  |<- block 0 ->|<- block 1 ->| ... |<- block n-1 ->|<- tail ->|
    ids          id0           id1              id(n-1)          id(n)

Block k's id names the chained hash of tokens [0, end of block k) (`hash_blocks`, the tail chained
on as one short block), renumbered densely in order of first appearance: two prompts share id k
exactly when they share the tokens of blocks 0..k, a tail only with an equal tail.
"""

import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TypedDict

from radixmesh.cluster.bench.schedule import Workload, open_loop
from radixmesh.cluster.sim.trace import TRACE_BLOCK_TOKENS
from radixmesh.proto.block_hash import BlockHash, hash_blocks


class TraceLine(TypedDict):
    """One request of a Mooncake trace file."""

    timestamp: int
    """Arrival in milliseconds from the schedule's start."""
    input_length: int
    output_length: int
    hash_ids: list[int]


@dataclass(slots=True)
class BlockIds:
    """Dense trace ids for chained block hashes, in order of first appearance."""

    block_tokens: int = TRACE_BLOCK_TOKENS
    _ids: dict[BlockHash, int] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        if self.block_tokens < 1:
            raise ValueError(f"block_tokens must be >= 1, got {self.block_tokens}")

    def ids(self, prompt: tuple[int, ...]) -> list[int]:
        """The prompt's hash ids, one per block, the partial last block included."""
        hashes = hash_blocks(prompt, self.block_tokens)
        tail = prompt[len(hashes) * self.block_tokens:]
        if tail:  # hashed as one short block: its bytes differ from any full block's, so it is never shared with one
            hashes += hash_blocks(tail, len(tail), parent=hashes[-1] if hashes else None)
        return [self._ids.setdefault(h, len(self._ids)) for h in hashes]


def trace_lines(workload: Workload, rate: float, requests: int, seed: int,
                block_tokens: int = TRACE_BLOCK_TOKENS) -> Iterator[TraceLine]:
    """The first `requests` requests the bench would send at `rate` with `seed`, as trace lines (fewer
    when a finite workload runs out). Raises ValueError for a bad rate, count or block size at once."""
    if not rate > 0:
        raise ValueError(f"rate must be > 0, got {rate}")
    if requests < 0:
        raise ValueError(f"requests must be >= 0, got {requests}")
    blocks = BlockIds(block_tokens)
    return (TraceLine(timestamp=round(r.arrival_s * 1000), input_length=len(r.prompt),
                      output_length=r.max_tokens, hash_ids=blocks.ids(r.prompt))
            for r in itertools.islice(open_loop(workload, rate, seed), requests))


def trace_text(workload: Workload, rate: float, requests: int, seed: int,
               block_tokens: int = TRACE_BLOCK_TOKENS) -> str:
    """`trace_lines` as the JSONL file's text, formatted as Mooncake's own files."""
    return "".join(json.dumps(line) + "\n" for line in trace_lines(workload, rate, requests, seed, block_tokens))
