"""The metadata benchmark's op stream and its in-process half (bench/metadata.py runs both halves).

A Mooncake-style trace becomes one stream of Match, BlockStored and BlockRemoved over 64 nodes, with
hot prefixes replicated and per-node LRU eviction; `bench_index` replays it on GlobalIndex and on a
naive dict-of-sets index (the baseline) and reports block-ops/s of each.
"""

import json
import statistics
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path

from radixmesh.cluster.metadata.index import GlobalIndex, PrefixLengths
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.events import BlockRemoved, BlockStored, Tier
from radixmesh.proto.ids import NodeId

LAYOUT = "bench-layout"
NODES = [NodeId(f"node-{i:02d}") for i in range(64)]
TRACE_BLOCK_TOKENS = 512
TRACE_BLOCK_BYTES = 32 * 2 * TRACE_BLOCK_TOKENS * 8 * 128 * 2  # a Llama-3-8B bf16 block of 512 tokens
HOT_REQUESTS = 8  # a first block seen this often is a hot prefix...
HOT_REPLICAS = 4  # ...served round-robin by this many nodes
NODE_CAPACITY = 1000  # blocks per node before LRU eviction

Op = tuple[str, NodeId | None, tuple[BlockHash, ...], BlockHash | None]
Found = tuple[int, dict[NodeId, PrefixLengths]]


def load_trace(path: Path) -> list[list[int]]:
    """Full-block hash ids of each request (the last, partial block is never shared)."""
    out = []
    with path.open() as f:
        for line in f:
            r = json.loads(line)
            out.append(r["hash_ids"][: r["input_length"] // TRACE_BLOCK_TOKENS])
    return [ids for ids in out if ids]


def op_stream(requests: list[list[int]]) -> list[Op]:
    """Per request: Match, then the serving node stores what it lacked and evicts LRU blocks."""
    hot = Counter(ids[0] for ids in requests)
    caches: dict[NodeId, OrderedDict[BlockHash, None]] = {n: OrderedDict() for n in NODES}
    ops: list[Op] = []
    for i, ids in enumerate(requests):
        hashes = tuple(BlockHash(x.to_bytes(16, "little")) for x in ids)
        base = ids[0] * 2654435761
        spread = HOT_REPLICAS if hot[ids[0]] >= HOT_REQUESTS else 1
        node = NODES[(base + i % spread) % len(NODES)]
        cache = caches[node]
        ops.append(("match", None, hashes, None))
        k = 0
        while k < len(hashes) and hashes[k] in cache:
            cache.move_to_end(hashes[k])
            k += 1
        if k < len(hashes):
            ops.append(("store", node, hashes[k:], hashes[k - 1] if k else None))
            cache.update(dict.fromkeys(hashes[k:]))
        if len(cache) > NODE_CAPACITY:
            evicted = []
            while len(cache) > NODE_CAPACITY:
                evicted.append(cache.popitem(last=False)[0])
            ops.append(("remove", node, tuple(evicted), None))
    return ops


class NaiveIndex:
    """The baseline: one dict of holder sets per tier, no structure, no per-node bookkeeping."""

    def __init__(self) -> None:
        self.tiers: dict[Tier, dict[BlockHash, set[NodeId]]] = {Tier.GPU: {}, Tier.HOST: {}, Tier.DISK: {}}

    def insert(self, node: NodeId, hashes: Sequence[BlockHash], tier: Tier) -> None:
        d = self.tiers[tier]
        for h in hashes:
            d.setdefault(h, set()).add(node)

    def remove(self, node: NodeId, hashes: Sequence[BlockHash], tier: Tier) -> None:
        d = self.tiers[tier]
        for h in hashes:
            s = d.get(h)
            if s is not None:
                s.discard(node)
                if not s:
                    del d[h]

    def match(self, hashes: Sequence[BlockHash]) -> Found:
        """Each node's run of `hashes` as PrefixLengths counts it: on gpu; on gpu or host; on some tier."""
        gpu, host, disk = self.tiers[Tier.GPU], self.tiers[Tier.HOST], self.tiers[Tier.DISK]
        empty: set[NodeId] = set()
        lengths: dict[NodeId, list[int]] = {}
        alive: list[set[NodeId]] = []
        depth = 0
        for h in hashes:
            g, ho, d = gpu.get(h, empty), host.get(h, empty), disk.get(h, empty)
            fast = g | ho if ho else g  # no copy for a tier that lacks the block, the common case
            some = fast | d if d else fast
            if not some:
                break
            if not depth:
                alive = [set(g), set(fast), set(some)]
                lengths = {n: [0, 0, 0] for n in some}
            for slot, held in ((0, g), (1, fast), (2, some)):
                for n in alive[slot] - held:
                    lengths[n][slot] = depth
                alive[slot] &= held
            depth += 1
        for slot, nodes in enumerate(alive):
            for n in nodes:
                lengths[n][slot] = depth
        return depth, {n: PrefixLengths(*v) for n, v in lengths.items()}


def replay_index(ops: list[Op], record: list[Found] | None = None) -> GlobalIndex:
    index = GlobalIndex()
    for n in NODES:
        index.add_node(n, LAYOUT)
    for kind, node, hashes, parent in ops:
        if kind == "match":
            found = index.match(LAYOUT, hashes)
            if record is not None:
                record.append((found.cluster_blocks, found.prefixes))
        elif kind == "store":
            index.apply(node, [BlockStored(hashes, parent, Tier.GPU)])  # type: ignore[arg-type]
        else:
            index.apply(node, [BlockRemoved(hashes, Tier.GPU)])  # type: ignore[arg-type]
    return index


def replay_naive(ops: list[Op], record: list[Found] | None = None) -> NaiveIndex:
    index = NaiveIndex()
    for kind, node, hashes, _ in ops:
        if kind == "match":
            found = index.match(hashes)
            if record is not None:
                record.append(found)
        elif kind == "store":
            index.insert(node, hashes, Tier.GPU)  # type: ignore[arg-type]
        else:
            index.remove(node, hashes, Tier.GPU)  # type: ignore[arg-type]
    return index


def best_rate(fn: Callable[[], object], work: int, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return work / best


def bench_index(ops: list[Op]) -> dict[str, float]:
    ours: list[Found] = []
    naive: list[Found] = []
    replay_index(ops, ours).check_invariants()
    replay_naive(ops, naive)
    assert ours == naive, "GlobalIndex and the naive index disagree"
    block_ops = sum(len(h) for _, _, h, _ in ops)
    idx = best_rate(lambda: replay_index(ops), block_ops)
    nai = best_rate(lambda: replay_naive(ops), block_ops)
    hit = sum(c for c, _ in ours) / max(1, sum(len(h) for k, _, h, _ in ops if k == "match"))
    return {
        "block_ops": block_ops,
        "index_block_ops_per_s": idx,
        "naive_block_ops_per_s": nai,
        "ratio_index_vs_naive": idx / nai,
        "trace_cluster_hit_blocks": hit,
        "mean_nodes_per_match": statistics.mean(len(p) for _, p in ours),
    }
