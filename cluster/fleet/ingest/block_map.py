"""EngineBlockMap: one external engine's cached blocks, translated into radixmesh's block hashes.

An engine names blocks with its own hashes (vLLM: sha256 over (parent, tokens, extra keys)), which
mean nothing to the router. A BlockStored event carries the tokens, so each engine block gets the
radixmesh chained hashes of the same tokens; the map keeps engine hash -> ours, because
BlockRemoved names engine hashes only. The rules (salt, untranslatable blocks, media, re-asserted
chains, how long translations live) and why: docs/routing.md#translating-an-engines-blocks.

Not thread-safe; one event loop owns it. Every method returns the radixmesh events to publish.
"""

import logging
from collections import Counter, OrderedDict
from dataclasses import dataclass, field

from radixmesh.proto.block_hash import BlockHash, hash_blocks, tenant_salt
from radixmesh.proto.events import AllCleared, BlockRemoved, BlockStored, CacheEvent, Tier
from radixmesh.proto.vllm_kv_events import (
    MEDIUM_TIERS,
    EngineHash,
    VllmAllBlocksCleared,
    VllmBlockRemoved,
    VllmBlockStored,
    VllmEvent,
)

logger = logging.getLogger(__name__)

@dataclass(slots=True)
class _Block:
    ours: tuple[BlockHash, ...]
    """Our hashes of this engine block's tokens, in order (k of them)."""
    our_parent: BlockHash | None
    """Our hash of the block before ours[0] (None at a root)."""
    parent: EngineHash | None
    """The engine's parent hash, to walk the chain up."""
    tiers: set[Tier] = field(default_factory=set)
    """Where the engine holds it now; empty: a translation kept for later events."""


class EngineBlockMap:
    """Translates one engine's events; `block_size` and `hash_key` are the router's."""

    def __init__(self, block_size: int, *, hash_key: bytes = b"", max_unheld: int = 1 << 20) -> None:
        if block_size < 1 or max_unheld < 0:
            raise ValueError(f"block_size must be >= 1 and max_unheld >= 0, got {block_size}, {max_unheld}")
        self.block_size = block_size
        self._key = hash_key
        self._max_unheld = max_unheld
        self._blocks: dict[EngineHash, _Block] = {}
        self._unheld: OrderedDict[EngineHash, None] = OrderedDict()
        """Blocks held on no tier, oldest first (their translations may be dropped)."""
        self.skipped: Counter[str] = Counter()
        """Engine blocks not indexed, by reason."""

    def __len__(self) -> int:
        """Engine blocks held on some tier."""
        return len(self._blocks) - len(self._unheld)

    def our_hashes(self, engine_hash: EngineHash) -> tuple[BlockHash, ...] | None:
        b = self._blocks.get(engine_hash)
        return b.ours if b is not None else None

    def apply(self, events: tuple[VllmEvent, ...] | list[VllmEvent]) -> list[CacheEvent]:
        out: list[CacheEvent] = []
        for e in events:
            if isinstance(e, VllmBlockStored):
                out += self.stored(e)
            elif isinstance(e, VllmBlockRemoved):
                out += self.removed(e)
            else:
                assert isinstance(e, VllmAllBlocksCleared)
                out += self.forget_holdings()
        return out

    def stored(self, e: VllmBlockStored) -> list[CacheEvent]:
        n = len(e.block_hashes)
        tier = self._tier(e.medium, e.group_idx, n)
        if tier is None or n == 0:
            return []
        if e.lora_name is not None or e.lora_id is not None:
            self.skipped["lora"] += n
            return []
        if e.block_size % self.block_size or len(e.token_ids) != n * e.block_size:
            reason = "block_size" if e.block_size % self.block_size else "malformed"
            logger.warning("BlockStored skipped (%s): %d blocks of %d tokens, %d token ids, our block size %d",
                           reason, n, e.block_size, len(e.token_ids), self.block_size)
            self.skipped[reason] += n
            return []
        salt = b""
        our_parent: BlockHash | None = None
        if e.parent_block_hash is not None:
            parent = self._blocks.get(e.parent_block_hash)
            if parent is None:
                self.skipped["unknown_parent"] += n
                return []
            our_parent = parent.ours[-1]
        out: list[CacheEvent] = []
        if e.parent_block_hash is not None and tier is Tier.GPU:
            out += self._reassert(e.parent_block_hash, tier)
        usable = n
        for i in range(n):
            extra = list(e.extra_keys[i] or ()) if e.extra_keys is not None else []
            if extra and extra[0] == e.lora_name:
                extra = extra[1:]
            if i == 0 and e.parent_block_hash is None and len(extra) == 1 and isinstance(extra[0], str):
                salt = tenant_salt(extra.pop())
            elif i == 0 and e.parent_block_hash is None and e.cache_salt:
                salt = tenant_salt(e.cache_salt)
            if extra:  # multimodal or prompt-embedding keys: tokens do not name this KV, nor its children's
                self.skipped["extra_keys"] += n - i
                usable = i
                break
        # One chained pass over every usable token, not one call per block (a 2000-block event: 15 ms
        # instead of 26 ms here); engine block i owns our hashes [i*k, (i+1)*k).
        k = e.block_size // self.block_size
        new = hash_blocks(e.token_ids[: usable * e.block_size], self.block_size, salt=salt, key=self._key,
                          parent=our_parent)
        first_parent = our_parent
        for i in range(usable):
            ours = tuple(new[i * k : (i + 1) * k])
            engine_parent = e.parent_block_hash if i == 0 else e.block_hashes[i - 1]
            self._hold(e.block_hashes[i], _Block(ours, our_parent, engine_parent), tier)
            our_parent = ours[-1]
        if new:
            out.append(BlockStored(tuple(new), first_parent, tier))
        return out

    def removed(self, e: VllmBlockRemoved) -> list[CacheEvent]:
        tier = self._tier(e.medium, e.group_idx, len(e.block_hashes))
        if tier is None:
            return []
        gone: list[BlockHash] = []
        for h in e.block_hashes:
            b = self._blocks.get(h)
            if b is None or tier not in b.tiers:
                continue  # never indexed (skipped, or stored before we listened)
            b.tiers.discard(tier)
            if not b.tiers:
                self._unhold(h)
            gone += b.ours
        return [BlockRemoved(tuple(gone), tier)] if gone else []

    def forget_holdings(self) -> list[CacheEvent]:
        """The engine holds nothing we know of (it cleared its cache, or we lost events): drop every
        holding, keep the translations."""
        for h, b in self._blocks.items():
            if b.tiers:
                b.tiers.clear()
                self._unheld[h] = None
        self._trim()
        return [AllCleared()]

    def chains(self) -> list[BlockStored]:
        """Every held block as chains per tier, parents before children (a NodeSnapshot's body)."""
        out: list[BlockStored] = []
        for tier in Tier:
            run: list[BlockHash] = []
            run_parent: BlockHash | None = None
            for b in self._blocks.values():
                if tier not in b.tiers:
                    continue
                if run and b.our_parent == run[-1]:
                    run += b.ours
                    continue
                if run:
                    out.append(BlockStored(tuple(run), run_parent, tier))
                run, run_parent = list(b.ours), b.our_parent
            if run:
                out.append(BlockStored(tuple(run), run_parent, tier))
        return out

    def check_invariants(self) -> None:
        unheld = [h for h, b in self._blocks.items() if not b.tiers]
        assert set(unheld) == set(self._unheld), f"{len(unheld)} unheld blocks, {len(self._unheld)} listed"
        assert len(self._unheld) <= self._max_unheld, f"{len(self._unheld)} unheld > {self._max_unheld}"
        for h, b in self._blocks.items():
            assert b.ours and all(len(x) == 16 for x in b.ours), f"block {h!r}: bad translation"

    # --- internals -----------------------------------------------------------------------------
    def _tier(self, medium: str | None, group_idx: int | None, n: int) -> Tier | None:
        if group_idx not in (None, 0):  # hybrid models: only the first KV cache group is indexed
            self.skipped["kv_group"] += n
            return None
        tier = MEDIUM_TIERS.get(medium if medium is not None else "GPU")
        if tier is None:
            self.skipped["medium"] += n
        return tier

    def _hold(self, h: EngineHash, block: _Block, tier: Tier) -> None:
        old = self._blocks.get(h)
        if old is not None and old.ours == block.ours:
            block.tiers = old.tiers
        self._blocks[h] = block
        self._unheld.pop(h, None)
        block.tiers.add(tier)

    def _unhold(self, h: EngineHash) -> None:
        self._unheld[h] = None
        self._trim()

    def _trim(self) -> None:
        while len(self._unheld) > self._max_unheld:
            h, _ = self._unheld.popitem(last=False)
            del self._blocks[h]

    def _reassert(self, parent: EngineHash, tier: Tier) -> list[CacheEvent]:
        """The chain ending at `parent` held on `tier` again, as one BlockStored (root first);
        nothing when it already is."""
        chain: list[tuple[EngineHash, _Block]] = []
        seen: set[EngineHash] = set()
        h: EngineHash | None = parent
        # `seen` stops a parent cycle, which only a broken or hostile engine could declare.
        while h is not None and h not in seen and (b := self._blocks.get(h)) is not None and tier not in b.tiers:
            chain.append((h, b))
            seen.add(h)
            h = b.parent
        if not chain:
            return []
        chain.reverse()
        for eh, b in chain:
            b.tiers.add(tier)
            self._unheld.pop(eh, None)
        hashes = tuple(x for _, b in chain for x in b.ours)
        return [BlockStored(hashes, chain[0][1].our_parent, tier)]
