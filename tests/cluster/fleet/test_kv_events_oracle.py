"""EngineBlockMap against an oracle, through the real GlobalIndex: random engine histories (shared
prefixes, stores under held chains, arbitrary evictions, cache resets, lost batches), checked after
every step. Without a lost batch the index holds exactly the engine's blocks; after one it never
holds a block the engine does not, and a request stored after it is indexed with its whole prefix
(the gpu chain a BlockStored re-asserts)."""

import hashlib

from hypothesis import given, settings
from hypothesis import strategies as st

from radixmesh.cluster.fleet.ingest.block_map import EngineBlockMap
from radixmesh.cluster.metadata.index import GlobalIndex
from radixmesh.proto.block_hash import BlockHash, hash_blocks
from radixmesh.proto.events import Tier
from radixmesh.proto.ids import NodeId
from radixmesh.proto.vllm_kv_events import (
    EngineHash,
    VllmAllBlocksCleared,
    VllmBlockRemoved,
    VllmBlockStored,
    VllmEvent,
)

BS = 2
NODE = NodeId("engine")


class FakeVllmCache:
    """Which blocks an engine holds: engine hash -> (parent, token path from the root)."""

    def __init__(self) -> None:
        self.held: dict[bytes, tuple[bytes | None, tuple[int, ...]]] = {}

    def reachable(self, h: bytes) -> bool:
        """A request can extend `h` only if its whole prefix is cached (prefix match starts at block 0)."""
        cur: bytes | None = h
        while cur is not None:
            if cur not in self.held:
                return False
            cur = self.held[cur][0]
        return True

    def store(self, parent: bytes | None, tokens: list[int]) -> list[VllmEvent]:
        """A request with prefix `parent` + `tokens` finishes its prefill: one BlockStored of every
        block after its cache hit, under the last block hit.

        As in vLLM: its prefix match (`find_longest_cache_hit`) stops at the first uncached block,
        and every block after that one is computed and stored, even one still cached (vLLM does not
        de-duplicate cached blocks). So no block after a miss is a hit left out of the event: the
        request would hold a block no event names, which nothing can recall after a lost batch.
        A duplicate is one block here: evicting it evicts every copy."""
        path = self.held[parent][1] if parent is not None else ()
        run: list[bytes] = []
        run_parent, prev = parent, parent
        for i in range(0, len(tokens), BS):
            path = (*path, *tokens[i : i + BS])
            h = hashlib.sha256(repr((prev, path[-BS:])).encode()).digest()
            if not run and h in self.held:
                run_parent = h
            else:
                self.held[h] = (prev, path)
                run.append(h)
            prev = h
        return [self._stored(run, run_parent)] if run else []

    def _stored(self, run: list[bytes], parent: bytes | None) -> VllmEvent:
        depth = len(self.held[parent][1]) if parent is not None else 0
        tokens = self.held[run[-1]][1][depth:]
        return VllmBlockStored(tuple(run), parent, tuple(tokens), BS, medium="GPU")

    def ours(self) -> set[BlockHash]:
        return {hash_blocks(path, BS)[-1] for _, path in self.held.values()}


def index_blocks(index: GlobalIndex) -> set[BlockHash]:
    return {h for c in index.node_chains(NODE) if c.tier is Tier.GPU for h in c.hashes}


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_index_follows_the_engine_exactly_or_conservatively_after_a_loss(data: st.DataObject) -> None:
    engine = FakeVllmCache()
    max_unheld = data.draw(st.sampled_from([0, 4, 1 << 20]))
    blocks = EngineBlockMap(BS, max_unheld=max_unheld)
    index = GlobalIndex()
    index.add_node(NODE, "layout")
    lost = False
    request: list[int] = []
    for _ in range(data.draw(st.integers(1, 30))):
        action = data.draw(st.sampled_from(["store", "store", "store", "evict", "clear", "lose"]))
        events: list[VllmEvent] = []
        if action == "store":
            roots = [h for h in engine.held if engine.reachable(h)]
            parent = data.draw(st.sampled_from([None, *roots]))
            tokens = data.draw(st.lists(st.integers(0, 2), min_size=BS, max_size=3 * BS))
            tokens = tokens[: len(tokens) // BS * BS]
            request = [*(engine.held[parent][1] if parent is not None else ()), *tokens]
            events = engine.store(parent, tokens)
        elif action == "evict" and engine.held:
            victims = data.draw(st.lists(st.sampled_from(sorted(engine.held)), min_size=1, max_size=3, unique=True))
            for v in victims:
                del engine.held[v]
            events = [VllmBlockRemoved(tuple(victims), "GPU")]
        elif action == "clear":
            engine.held.clear()
            events = [VllmAllBlocksCleared()]
        if not events:
            continue
        if data.draw(st.integers(0, 9)) == 0:  # this batch is lost: the subscriber sees a gap and forgets
            lost = True
            index.apply(NODE, blocks.forget_holdings())
            continue
        # Recall after a loss needs the translations of the request's prefix (never dropped here).
        known, seen = max_unheld == 1 << 20, set[EngineHash]()
        for e in events:
            if isinstance(e, VllmBlockStored):
                p = e.parent_block_hash
                known = known and (p is None or p in seen or blocks.our_hashes(p) is not None)
                seen.update(e.block_hashes)
        index.apply(NODE, blocks.apply(events))
        lost = lost and action != "clear"  # a delivered reset leaves nothing to be wrong about
        blocks.check_invariants()
        index.check_invariants()
        held, truth = index_blocks(index), engine.ours()
        if lost:
            assert held <= truth, f"index holds {len(held - truth)} block(s) the engine does not"
        else:
            assert held == truth
        if action == "store" and known:  # even after a loss: the request holds its prefix, so it is indexed
            assert set(hash_blocks(request, BS)) <= held


def test_the_fake_engine_stores_every_block_after_the_first_miss() -> None:
    engine = FakeVllmCache()
    engine.store(None, [0, 0, 2, 1, 0, 0, 0, 2])
    a, c, d, e = engine.held
    del engine.held[c], engine.held[d]  # E stays: vLLM evicts a block whatever its children
    assert engine.store(a, [2, 1, 0, 0, 0, 2]) == [
        VllmBlockStored((c, d, e), a, (2, 1, 0, 0, 0, 2), BS, medium="GPU")]


def test_a_request_stored_again_after_lost_evictions_is_indexed_whole() -> None:
    """The shrunk history that once failed the recall check: A C D E stored, a lost batch evicting
    C and D, the request again (its hit stops at C, so C D E are stored again under A)."""
    tokens = (0, 0, 2, 1, 0, 0, 0, 2)
    blocks = EngineBlockMap(BS)
    index = GlobalIndex()
    index.add_node(NODE, "layout")
    index.apply(NODE, blocks.apply([VllmBlockStored((b"A", b"C", b"D", b"E"), None, tokens, BS, medium="GPU")]))
    index.apply(NODE, blocks.forget_holdings())
    index.apply(NODE, blocks.apply([VllmBlockStored((b"C", b"D", b"E"), b"A", tokens[BS:], BS, medium="GPU")]))
    assert index_blocks(index) == set(hash_blocks(tokens, BS))
    blocks.check_invariants()
    index.check_invariants()
