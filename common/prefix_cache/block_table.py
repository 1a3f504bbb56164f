"""Sequences over a prefix cache: block tables, prefix reuse, chunked growth, append, fork with
copy-on-write, commit into the cache, release.

The one implementation of a block table: the node's NodeMemory places its requests with it (the
gpu tier), and memory-only callers (bench/incident_replay.py) use it directly.
"""

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, NewType

from radixmesh.common.prefix_cache.prefix_cache import PrefixCache
from radixmesh.proto.block_hash import BlockHash, hash_blocks
from radixmesh.proto.ids import BlockId

SeqId = NewType("SeqId", int)
_MAX_TOKEN = 2**31  # tokens are hashed as int32


class BlockCopy(NamedTuple):
    """KV the engine must copy before writing: block `src` into block `dst` (copy-on-write)."""

    src: BlockId
    dst: BlockId


@dataclass(slots=True)
class BlockTable:
    """One sequence's tokens and block table.

    Block i of the table holds tokens ``[i*bs, (i+1)*bs)``. The table may run past the tokens
    (blocks reserved for growth) or stop short of them (tokens not placed yet: chunked prefill
    reserves room chunk by chunk)::

        tokens:       [ t0 ...                                 t(n-1) ]
        block_table:  [ cached | cached | fresh | fresh ]               (short: chunked)
                        ^ num_cached_blocks = 2

    ``hashes[i]`` names full block i (chained from `salt`); it grows on demand, never past the
    full blocks of `tokens`. The sequence holds one reference on every block of its table.
    """

    seq_id: SeqId
    tokens: list[int]
    salt: bytes = b""
    block_table: list[BlockId] = field(default_factory=list)
    hashes: list[BlockHash] = field(default_factory=list)
    num_cached_blocks: int = 0
    """Leading blocks that came from the prefix cache (their KV need not be computed)."""
    num_committed: int = 0
    """Leading full blocks already inserted into the cache."""
    released: bool = False


class SequenceManager:
    """Creates, grows, forks and releases sequences on one tier's PrefixCache.

    Every method is all-or-nothing: on OutOfBlocks or ValueError the sequence and the pool are
    unchanged (a failed `start` releases the prefix blocks it pinned).
    """

    def __init__(self, cache: PrefixCache, block_size: int, *, key: bytes = b"") -> None:
        """`key`: the cluster's block-hash key (block_hash.hash_blocks); salts are per sequence."""
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.cache = cache
        self.block_size = block_size
        self._key = key
        self._ids = itertools.count()

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks that hold `num_tokens` tokens."""
        return -(-num_tokens // self.block_size)

    def create(self, tokens: Sequence[int], *, salt: bytes = b"", hashes: Sequence[BlockHash] = ()) -> BlockTable:
        """A live sequence holding no block yet (place it with attach_prefix / reserve, or start).
        `hashes`: the chained hashes of its first full blocks under `salt` and this manager's key,
        when the caller has them already (the agent hashes each prompt once); they are taken as
        given, and block_hashes hashes only the blocks past them."""
        _check_tokens(tokens)
        if len(hashes) * self.block_size > len(tokens):
            raise ValueError(f"{len(hashes)} block hashes for a {len(tokens)}-token sequence")
        return BlockTable(SeqId(next(self._ids)), list(tokens), salt, hashes=list(hashes))

    def block_hashes(self, seq: BlockTable, num_blocks: int) -> list[BlockHash]:
        """Chained hashes of the first `num_blocks` full blocks (hashing those not hashed yet)."""
        bs = self.block_size
        if num_blocks * bs > len(seq.tokens):
            raise ValueError(f"{num_blocks} full blocks asked of a {len(seq.tokens)}-token sequence")
        have = len(seq.hashes)
        if num_blocks > have:
            parent = seq.hashes[-1] if seq.hashes else None
            tail = seq.tokens[have * bs : num_blocks * bs]
            seq.hashes.extend(hash_blocks(tail, bs, salt=seq.salt, key=self._key, parent=parent))
        return seq.hashes[:num_blocks]

    def start(self, tokens: Sequence[int], *, salt: bytes = b"", reserve_tokens: int = 0,
              contiguous: bool = False) -> BlockTable:
        """A sequence for a prompt: reuses its longest cached prefix (pinned) and allocates blocks
        for the rest of the prompt plus `reserve_tokens` of growth (one run if `contiguous`)."""
        if reserve_tokens < 0:
            raise ValueError(f"reserve_tokens must be >= 0, got {reserve_tokens}")
        seq = self.create(tokens, salt=salt)
        self.attach_prefix(seq, self.cache.match(self.block_hashes(seq, len(tokens) // self.block_size)))
        try:
            self.reserve(seq, len(tokens) + reserve_tokens, contiguous=contiguous)
        except BaseException:
            self.drop_blocks(seq)
            raise
        return seq

    def attach_prefix(self, seq: BlockTable, blocks: Sequence[BlockId]) -> None:
        """Make `blocks` the start of an empty table: cached blocks holding the sequence's first
        full blocks, each pinned once by the caller, whose references pass to the sequence."""
        _check_live(seq)
        if seq.block_table:
            raise ValueError(f"sequence {seq.seq_id} already holds blocks")
        if len(blocks) * self.block_size > len(seq.tokens):
            raise ValueError(f"a {len(blocks)}-block prefix is longer than the sequence")
        seq.block_table = list(blocks)
        seq.num_cached_blocks = seq.num_committed = len(blocks)

    def reserve(self, seq: BlockTable, num_tokens: int, *, contiguous: bool = False) -> None:
        """Grow the table to hold at least `num_tokens` tokens (new blocks in one run if
        `contiguous`); raises OutOfBlocks with the sequence unchanged."""
        _check_live(seq)
        need = self.blocks_for(num_tokens) - len(seq.block_table)
        if need > 0:
            seq_len = max(num_tokens, len(seq.tokens))
            seq.block_table += self.cache.pool.allocate(need, contiguous=contiguous, seq_len=seq_len)

    def commit(self, seq: BlockTable, num_tokens: int | None = None) -> None:
        """Insert the full blocks among the first `num_tokens` tokens (default: all) that are not
        in the cache yet; their KV must be written."""
        _check_live(seq)
        n = len(seq.tokens) if num_tokens is None else num_tokens
        if not 0 <= n <= min(len(seq.tokens), len(seq.block_table) * self.block_size):
            raise ValueError(f"cannot commit {n} tokens of a {len(seq.tokens)}-token sequence "
                             f"holding {len(seq.block_table)} blocks")
        done, full = seq.num_committed, n // self.block_size
        if full > done:
            hashes = self.block_hashes(seq, full)
            parent = hashes[done - 1] if done else None
            self.cache.insert(hashes[done:full], seq.block_table[done:full], parent)
            seq.num_committed = full

    def append(self, seq: BlockTable, tokens: Sequence[int]) -> list[BlockCopy]:
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
        cow = (bool(pos % bs) and bool(tokens) and last < len(seq.block_table)
               and pool.ref_count(seq.block_table[last]) > 1)
        grow = max(self.blocks_for(pos + len(tokens)) - len(seq.block_table), 0)
        fresh = pool.allocate(grow + cow, seq_len=pos + len(tokens))
        copies: list[BlockCopy] = []
        if cow:
            src, dst = seq.block_table[last], fresh.pop()
            pool.free([src])
            seq.block_table[last] = dst
            copies.append(BlockCopy(src, dst))
        seq.block_table.extend(fresh)
        seq.tokens.extend(tokens)
        self.block_hashes(seq, len(seq.tokens) // bs)
        return copies

    def fork(self, seq: BlockTable) -> BlockTable:
        """A child sharing every block that holds tokens (reserved blocks stay with the parent);
        the partial last block is shared until either side appends (copy-on-write)."""
        _check_live(seq)
        shared = seq.block_table[: self.blocks_for(len(seq.tokens))]
        self.cache.pool.incref(shared)
        return BlockTable(
            SeqId(next(self._ids)),
            list(seq.tokens),
            seq.salt,
            list(shared),
            list(seq.hashes),
            seq.num_cached_blocks,
            seq.num_committed,
        )

    def drop_blocks(self, seq: BlockTable) -> None:
        """Give back every block of the table; the sequence stays live with its tokens and can be
        placed again (preemption by recompute or swap)."""
        _check_live(seq)
        self.cache.release(seq.block_table)
        seq.block_table = []
        seq.num_cached_blocks = seq.num_committed = 0

    def release(self, seq: BlockTable) -> None:
        """Drop the sequence's references for good; its committed blocks stay cached until evicted."""
        self.drop_blocks(seq)
        seq.released = True


def _check_live(seq: BlockTable) -> None:
    if seq.released:
        raise ValueError(f"sequence {seq.seq_id} was already released")


def _check_tokens(tokens: Sequence[int]) -> None:
    if len(tokens) and (min(tokens) < 0 or max(tokens) >= _MAX_TOKEN):
        raise ValueError(f"token ids must lie in [0, 2**31), got min {min(tokens)} max {max(tokens)}")
