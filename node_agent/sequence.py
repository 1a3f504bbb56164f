"""Sequences over a prefix cache: block tables, prefix reuse, append, fork with copy-on-write."""

import itertools
import logging
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import NamedTuple, NewType

from radixmesh.node_agent.block_hash import BlockHash, hash_blocks
from radixmesh.node_agent.ids import BlockId
from radixmesh.node_agent.prefix_cache import PrefixCache

logger = logging.getLogger(__name__)

SeqId = NewType("SeqId", int)
_MAX_TOKEN = 2**31  # tokens are hashed as int32


class BlockCopy(NamedTuple):
    """KV the engine must copy before writing: block `src` into block `dst` (copy-on-write)."""

    src: BlockId
    dst: BlockId


@dataclass(slots=True)
class Sequence:
    """One sequence's tokens and block table.

    Block i of the table holds tokens ``[i*bs, (i+1)*bs)``; the table may run past the tokens
    (blocks reserved for decoding). ``hashes[i]`` names full block i.
    """

    seq_id: SeqId
    tokens: list[int]
    block_table: list[BlockId]
    hashes: list[BlockHash]
    num_cached_blocks: int
    """Leading blocks that came from the prefix cache (their KV need not be computed)."""
    num_committed: int
    """Leading full blocks already inserted into the cache."""
    released: bool = False


class SequenceManager:
    """Creates, grows, forks and releases sequences on one tier's PrefixCache.

    Every method is all-or-nothing: on OutOfBlocks or ValueError the sequence and the pool are
    unchanged (a failed `start` releases the prefix blocks it pinned).
    """

    def __init__(self, cache: PrefixCache, block_size: int, *, salt: bytes = b"", key: bytes = b"") -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.cache = cache
        self.block_size = block_size
        self._salt = salt
        self._key = key
        self._ids = itertools.count()

    def _blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def start(self, tokens: Seq[int], *, reserve_tokens: int = 0, contiguous: bool = False) -> Sequence:
        """A sequence for a prompt: reuses its longest cached prefix (pinned) and allocates blocks
        for the rest of the prompt plus `reserve_tokens` of growth (one run if `contiguous`)."""
        _check_tokens(tokens)
        if reserve_tokens < 0:
            raise ValueError(f"reserve_tokens must be >= 0, got {reserve_tokens}")
        hashes = hash_blocks(tokens, self.block_size, salt=self._salt, key=self._key)
        cached = self.cache.match(hashes)
        need = self._blocks_for(len(tokens) + reserve_tokens) - len(cached)
        try:
            fresh = self.cache.pool.allocate(
                max(need, 0), contiguous=contiguous, seq_len=len(tokens) + reserve_tokens
            )
        except BaseException:
            self.cache.release(cached)
            raise
        return Sequence(
            SeqId(next(self._ids)), list(tokens), cached + fresh, hashes, len(cached), len(cached)
        )

    def commit(self, seq: Sequence) -> None:
        """Insert the sequence's full blocks not yet in the cache (their KV is written)."""
        _check_live(seq)
        done = seq.num_committed
        full = len(seq.hashes)
        if full > done:
            parent = seq.hashes[done - 1] if done else None
            self.cache.insert(seq.hashes[done:full], seq.block_table[done:full], parent)
            seq.num_committed = full

    def append(self, seq: Sequence, tokens: Seq[int]) -> list[BlockCopy]:
        """Append tokens, allocating blocks as needed; returns the copies the engine must do first.

        Copy-on-write: when the partial last block is shared (after a fork), this sequence gets a
        private copy of it before writing, so the other sequence's tokens stay intact.
        """
        _check_live(seq)
        _check_tokens(tokens)
        bs, pool = self.block_size, self.cache.pool
        pos = len(seq.tokens)
        #   block_table: [ full | full | partial(pos % bs tokens) | reserved... ]
        #                                 ^ pos // bs: written into when pos % bs != 0
        last = pos // bs
        cow = bool(pos % bs) and bool(tokens) and pool.ref_count(seq.block_table[last]) > 1
        grow = max(self._blocks_for(pos + len(tokens)) - len(seq.block_table), 0)
        fresh = pool.allocate(grow + cow, seq_len=pos + len(tokens))
        copies: list[BlockCopy] = []
        if cow:
            src, dst = seq.block_table[last], fresh.pop()
            pool.free([src])
            seq.block_table[last] = dst
            copies.append(BlockCopy(src, dst))
        seq.block_table.extend(fresh)
        seq.tokens.extend(tokens)
        full = len(seq.tokens) // bs
        if full > len(seq.hashes):
            parent = seq.hashes[-1] if seq.hashes else None
            start = len(seq.hashes) * bs
            seq.hashes.extend(
                hash_blocks(seq.tokens[start : full * bs], bs, salt=self._salt, key=self._key, parent=parent)
            )
        return copies

    def fork(self, seq: Sequence) -> Sequence:
        """A child sharing every block that holds tokens (reserved blocks stay with the parent);
        the partial last block is shared until either side appends (copy-on-write)."""
        _check_live(seq)
        shared = seq.block_table[: self._blocks_for(len(seq.tokens))]
        self.cache.pool.incref(shared)
        return Sequence(
            SeqId(next(self._ids)),
            list(seq.tokens),
            list(shared),
            list(seq.hashes),
            seq.num_cached_blocks,
            seq.num_committed,
        )

    def release(self, seq: Sequence) -> None:
        """Drop the sequence's references; its committed blocks stay cached until evicted."""
        _check_live(seq)
        self.cache.release(seq.block_table)
        seq.block_table = []
        seq.released = True


def _check_live(seq: Sequence) -> None:
    if seq.released:
        raise ValueError(f"sequence {seq.seq_id} was already released")


def _check_tokens(tokens: Seq[int]) -> None:
    if len(tokens) and (min(tokens) < 0 or max(tokens) >= _MAX_TOKEN):
        raise ValueError(f"token ids must lie in [0, 2**31), got min {min(tokens)} max {max(tokens)}")
