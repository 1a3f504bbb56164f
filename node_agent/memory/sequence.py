"""What node memory knows of a sequence: the blocks a pull brings (PendingPrefix), the two ways a
sequence gives up its gpu blocks (PreemptMode), and the fields of the engine's SequenceState that
memory reads and writes (SequenceBlocks), so memory never imports the scheduler."""

from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from radixmesh.common.prefix_cache.block_table import BlockTable
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.ids import BlockId
from radixmesh.proto.serve.tokens import TokenSources


class PreemptMode(StrEnum):
    SWAP = "swap"
    """Copy the blocks to the host tier; resume by copying them back."""
    RECOMPUTE = "recompute"
    """Drop the blocks; resume by prefilling prompt + output again (cached prefix blocks still hit)."""


@dataclass(eq=False, slots=True)
class PendingPrefix:
    """Prompt blocks the caller pulls from a peer while its request waits in the engine's queue.

    The caller sets `end_block`; Engine.submit (on the engine thread) fills in the rest, skipping
    what this node holds already, and allocates one pool block per block to pull::

        prompt blocks  [0, start)  | [start, start + len(block_ids))  | [.., end_block)
                       cached here | pulled into block_ids (in order) | no room: computed

    `block_ids` are named by no block table and no prefix cache until they land, so no step reads
    them and the caller may write their KV off the engine thread. The request is not admitted
    before Engine.land_pull says how many of them arrived; the engine frees the rest then (also
    when the request was aborted meanwhile: a block the transfer may still write is never freed
    before). Empty `block_ids`: nothing to pull (all cached here, or no room), and nothing to land.
    """

    end_block: int
    start: int = 0
    block_ids: tuple[BlockId, ...] = ()
    hashes: tuple[BlockHash, ...] = ()
    """The chained hashes of prompt blocks [start, end_block): what to ask the peer for."""
    parent: BlockHash | None = None
    """The hash of prompt block start - 1 (None when start is 0)."""


class PromptSources(Protocol):
    """Where a request's prompt tokens came from (the engine's RequestStats)."""

    @property
    def prompt_tokens(self) -> int: ...

    sources: TokenSources | None
    """Set by memory at the request's first admission (None before it)."""


class SequenceBlocks(Protocol):
    """One sequence as node memory sees it (the engine's SequenceState): token ranges
    ``tokens[:num_computed]`` have K/V in ``block_ids`` (gpu); the sequence holds one reference on
    each of ``block_ids`` and, while swapped out, on each of ``host_block_ids``. Memory mutates
    `num_computed`, `host_block_ids`, `pulling`, `external_hashes` and `stats.sources`; the block
    table through SequenceManager."""

    table: BlockTable
    num_computed: int
    host_block_ids: list[BlockId]
    pulling: PendingPrefix | None
    external_hashes: frozenset[BlockHash]

    @property
    def stats(self) -> PromptSources: ...

    @property
    def tokens(self) -> list[int]: ...

    @property
    def block_ids(self) -> list[BlockId]: ...

    @property
    def num_uncomputed(self) -> int: ...

    @property
    def is_swapped(self) -> bool: ...
