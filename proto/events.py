"""Cache events a node publishes so the global index can follow its prefix blocks."""

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
