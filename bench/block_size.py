"""Block-size study: hit rate, fragmentation and metadata bytes per block at block sizes 8/16/32/64 on
the shared Mooncake traces, against the default (16) measured in the same run.

    python bench/block_size.py [--limit K] [--out DIR] [--smoke]

- Hit rate: token-weighted prompt hit rate of one LRU prefix cache (the real PrefixCache/BlockPool)
  holding the memory of 8 and of 64 nodes x 500 trace blocks (512 tokens each), requests in arrival
  order. A trace block is one hash id per 512 tokens; a block of `bs` tokens inside it is named by
  (hash id, position), which the id's chaining makes a whole-prefix name, and only full blocks are
  shared, so a smaller block reuses more of a shared trailing partial trace block.
- Fragmentation: KV slots a request's last partial block wastes (prompt + output), over slots allocated.
- Metadata: Python bytes per block of the node's pool + prefix cache and of the cluster's GlobalIndex
  (tracemalloc, 20k blocks), and so per token.
Adaptive block size is worth building only if some size beats 16 by more than 5% on hit rate (the
issue's bar); the run says whether one does. JSON in bench/results/block_size.json.
"""

import argparse
import json
import math
import time
import tracemalloc
from pathlib import Path

from radixmesh.cluster.metadata.index import GlobalIndex
from radixmesh.cluster.sim.trace import TRACE_BLOCK_TOKENS, TraceRequest, read_trace
from radixmesh.common.block_pool.block_pool import BlockPool
from radixmesh.common.prefix_cache.prefix_cache import PrefixCache
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.events import Tier
from radixmesh.proto.ids import NodeId

TRACES = Path(__file__).resolve().parents[1] / "tests" / "data" / "traces"
RESULTS = Path(__file__).resolve().parent / "results"
SIZES = (8, 16, 32, 64)
BASE = 16
NODES = (8, 64)
NODE_TRACE_BLOCKS = 500
GAIN_BAR = 1.05
META_BLOCKS = 20_000
SMOKE_LIMIT = 100  # requests per trace in a smoke run
SMOKE_META_BLOCKS = 2_000


def block_hashes(r: TraceRequest, bs: int) -> list[BlockHash]:
    """Full blocks of `bs` tokens of the prompt, each named by (trace hash id, index inside it)."""
    out = []
    last = len(r.hash_ids) - 1
    for i, hid in enumerate(r.hash_ids):
        tokens = TRACE_BLOCK_TOKENS if i < last else r.input_length - TRACE_BLOCK_TOKENS * last
        key = hid.to_bytes(8, "little", signed=True)
        out += [BlockHash(key + j.to_bytes(8, "little")) for j in range(tokens // bs)]
    return out


def lru_hit_rate(reqs: list[TraceRequest], bs: int, capacity_tokens: int) -> float:
    cache = PrefixCache(BlockPool(capacity_tokens // bs))
    pool = cache.pool
    hit = total = 0
    for r in reqs:
        hashes = block_hashes(r, bs)
        local = cache.match(hashes)
        n = min(len(hashes) - len(local), pool.num_free + pool.num_cached)
        new = pool.allocate(n)
        if new:
            lo = len(local)
            cache.insert(hashes[lo: lo + n], new, hashes[lo - 1] if lo else None)
        cache.release(local + new)
        cache.take_events()
        hit += len(local) * bs
        total += r.input_length
    return hit / total


def waste(reqs: list[TraceRequest], bs: int) -> float:
    """Slots wasted in each sequence's last partial block over all slots allocated (prompt + output)."""
    used = [r.input_length + r.output_length for r in reqs]
    slots = sum(math.ceil(u / bs) * bs for u in used)
    return (slots - sum(used)) / slots


def metadata_bytes_per_block(n: int = META_BLOCKS) -> tuple[float, float]:
    """(pool + prefix cache, GlobalIndex) Python bytes per cached block, by tracemalloc."""
    hashes = [BlockHash(i.to_bytes(16, "little")) for i in range(n)]
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    cache = PrefixCache(BlockPool(n))
    ids = cache.pool.allocate(n)
    cache.insert(hashes, ids)
    cache.release(ids)
    cache.take_events()
    node = tracemalloc.get_traced_memory()[0] - base
    base = tracemalloc.get_traced_memory()[0]
    index = GlobalIndex()
    index.add_node(NodeId("n0"), "bench")
    for i in range(0, n, 64):
        index.insert(NodeId("n0"), hashes[i: i + 64], hashes[i - 1] if i else None, Tier.GPU)
    meta = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    assert len(cache) == n and len(index) > 0
    return node / n, meta / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, default=None, help="first K requests of each trace")
    ap.add_argument("--out", type=Path, default=RESULTS, help="folder for block_size.json")
    ap.add_argument("--smoke", action="store_true", help=f"tiny run: {SMOKE_LIMIT} requests per trace")
    args = ap.parse_args()
    if args.smoke:  # smaller defaults; sizes given on the command line still win
        ap.set_defaults(limit=SMOKE_LIMIT)
        args = ap.parse_args()
    t0 = time.perf_counter()
    node_b, index_b = metadata_bytes_per_block(SMOKE_META_BLOCKS if args.smoke else META_BLOCKS)
    out: dict[str, object] = {"sizes": list(SIZES), "base": BASE, "node_bytes_per_block": node_b,
                              "index_bytes_per_block": index_b, "traces": {}}
    best_gain = 0.0
    for name in ("synthetic_trace", "mooncake_trace_1000"):
        reqs = list(read_trace(TRACES / f"{name}.jsonl", limit=args.limit))
        rows: dict[str, dict[str, float]] = {}
        for bs in SIZES:
            row = {"waste": waste(reqs, bs), "node_bytes_per_token": node_b / bs, "index_bytes_per_token": index_b / bs}
            for n in NODES:
                row[f"hit_rate_{n}"] = lru_hit_rate(reqs, bs, n * NODE_TRACE_BLOCKS * TRACE_BLOCK_TOKENS)
            rows[str(bs)] = row
        print(f"\n{name}: {len(reqs)} requests; one LRU cache of 8 / 64 nodes x {NODE_TRACE_BLOCKS} trace blocks")
        print(f"{'bs':>4}{'hit 8':>8}{'/bs16':>7}{'hit 64':>8}{'/bs16':>7}{'waste':>8}{'node B/tok':>11}{'index B/tok':>12}")
        for bs in SIZES:
            r, b = rows[str(bs)], rows[str(BASE)]
            for n in NODES:
                r[f"ratio_{n}"] = r[f"hit_rate_{n}"] / b[f"hit_rate_{n}"]
                best_gain = max(best_gain, r[f"ratio_{n}"])
            print(f"{bs:>4}{r['hit_rate_8']:>8.4f}{r['ratio_8']:>7.3f}{r['hit_rate_64']:>8.4f}{r['ratio_64']:>7.3f}"
                  f"{r['waste']:>8.4f}{r['node_bytes_per_token']:>11.1f}{r['index_bytes_per_token']:>12.1f}")
        out["traces"][name] = rows  # type: ignore[index]
    adaptive = best_gain > GAIN_BAR
    print(f"\nmetadata: {node_b:.0f} B/block on a node (pool + prefix cache), {index_b:.0f} B/block in the index")
    print(f"best hit-rate gain over bs={BASE}: {best_gain:.3f}x -> adaptive block size "
          f"{'pays (> 5%)' if adaptive else 'does not pay (<= 5%): not built'}")
    out["best_gain_over_base"] = best_gain
    out["adaptive_pays"] = adaptive
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    if args.smoke:
        out["smoke"] = True
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "block_size.json").write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
