"""Cache events a node publishes so the global index can follow its prefix blocks."""

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from radixmesh.proto.block_hash import BlockHash


class Tier(StrEnum):
    """Where a copy of a block lives."""

    GPU = "gpu"
    HOST = "host"
    DISK = "disk"


@dataclass(frozen=True, slots=True)
class BlockStored:
    """`hashes` became matchable on `tier`; `parent` is the hash before hashes[0] (None at a root)."""

    hashes: tuple[BlockHash, ...]
    parent: BlockHash | None
    tier: Tier


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """`hashes` are no longer held on `tier`."""

    hashes: tuple[BlockHash, ...]
    tier: Tier


@dataclass(frozen=True, slots=True)
class AllCleared:
    """Every block of the node is gone (restart, reset): the index drops the node's entries."""


CacheEvent = BlockStored | BlockRemoved | AllCleared


def chains(pairs: Iterable[tuple[BlockHash, BlockHash | None]], tier: Tier) -> list[BlockStored]:
    """(hash, parent) pairs in insertion order as BlockStored chains: a pair whose parent is the hash
    just before it extends the current chain."""
    out: list[BlockStored] = []
    run: list[BlockHash] = []
    parent: BlockHash | None = None
    for h, p in pairs:
        if run and p == run[-1]:
            run.append(h)
            continue
        if run:
            out.append(BlockStored(tuple(run), parent, tier))
        run, parent = [h], p
    if run:
        out.append(BlockStored(tuple(run), parent, tier))
    return out
