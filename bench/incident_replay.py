"""Replay of the seed's OOM incident on one node pool: an incident-style allocator vs radixmesh.

200 deterministic requests over 63 shared 4-shot prefixes, cold start, on a pool of exactly the peak
blocks the live requests would need unshared. (a) ``naive``: the incident's allocator, in this file:
one contiguous first-fit run per sequence for its whole KV; (b) ``radixmesh``: BlockPool + PrefixCache
+ SequenceManager. Figures per allocator: OOMs by reason, peak ghost-block bytes, peak fragmentation
and prefix hit rate. The stream and both allocators in full: docs/benchmarks.md#benchincident_replaypy.

Last line: one JSON object ``{"naive": {...}, "radixmesh": {...}}``, also written to
DIR/incident_replay.json (default bench/results). Run: ``python bench/incident_replay.py [--out DIR] [--smoke]``.
A smoke run is the same replay (it takes about two seconds), its JSON marked as a smoke run.
"""

import argparse
import bisect
import heapq
import json
import random
from dataclasses import dataclass
from pathlib import Path

from radixmesh.common.block_pool.block_pool import BlockPool, OOMReason, OutOfBlocks
from radixmesh.common.block_pool.config import PoolConfig
from radixmesh.common.prefix_cache.block_table import BlockTable, SequenceManager
from radixmesh.common.prefix_cache.prefix_cache import PrefixCache
from radixmesh.proto.block_hash import BlockHash, hash_blocks
from radixmesh.proto.kv_layout import KVLayout

SEED = 20240611
REQUESTS = 200
PREFIXES = 63
WINDOW_S = 30.0
BLOCK_SIZE = 16
MAX_PROMPT = 4096
PREFILL_TOKENS_PER_S = 8000.0
DECODE_S_PER_TOKEN = 0.05
LAYOUT = KVLayout("llama-3-8b", num_layers=32, num_kv_heads=8, head_dim=128, dtype="bfloat16", block_size=16)


@dataclass(frozen=True, slots=True)
class Request:
    rid: int
    arrival: float
    prefix: int
    tokens: tuple[int, ...]
    output_tokens: int

    @property
    def blocks(self) -> int:
        return -(-(len(self.tokens) + self.output_tokens) // BLOCK_SIZE)


def request_stream(seed: int = SEED) -> list[Request]:
    """The deterministic stream described in the module docstring."""
    rng = random.Random(seed)

    def text(lo: int, hi: int) -> list[int]:
        return [rng.randrange(32000) for _ in range(rng.randint(lo, hi))]

    prefixes = [text(64, 256) + [t for _ in range(4) for t in text(128, 640)] for _ in range(PREFIXES)]
    choice = list(range(PREFIXES)) + [rng.randrange(PREFIXES) for _ in range(REQUESTS - PREFIXES)]
    rng.shuffle(choice)
    arrivals = sorted(rng.uniform(0.0, WINDOW_S) for _ in range(REQUESTS))
    out = []
    for rid, (p, at) in enumerate(zip(choice, arrivals, strict=True)):
        tokens = (prefixes[p] + text(32, 1024))[:MAX_PROMPT]
        out.append(Request(rid, at, p, tuple(tokens), rng.randint(64, 512)))
    return out


def service_s(req: Request, cached_blocks: int) -> float:
    uncached = len(req.tokens) - cached_blocks * BLOCK_SIZE
    return uncached / PREFILL_TOKENS_PER_S + req.output_tokens * DECODE_S_PER_TOKEN


def peak_demand(stream: list[Request]) -> int:
    """Most blocks the live requests ever need together, nothing shared, nothing cached."""
    events = [(r.arrival, r.blocks) for r in stream] + [
        (r.arrival + service_s(r, 0), -r.blocks) for r in stream
    ]
    live = peak = 0
    for _, delta in sorted(events, key=lambda e: (e[0], e[1] > 0)):
        live += delta
        peak = max(peak, live)
    return peak


class NaiveRunAllocator:
    """The incident's allocator: one contiguous run per sequence, first fit, eager prefix free."""

    def __init__(self, num_blocks: int) -> None:
        self.free_runs: list[tuple[int, int]] = [(0, num_blocks)]  # (start, length), by start
        self.ref = [0] * num_blocks
        self.run_of: dict[int, int] = {}  # block -> start of the run that owns it
        self.runs: dict[int, int] = {}  # live run start -> length
        self.live_refs: dict[int, int] = {}  # live run start -> blocks in it with ref > 0
        self.table: dict[BlockHash, int] = {}
        self.hash_of: dict[int, BlockHash] = {}

    def match(self, hashes: list[BlockHash]) -> list[int]:
        out = []
        for h in hashes:
            if h not in self.table:
                break
            out.append(self.table[h])
        return out

    def admit(self, hashes: list[BlockHash], need: int) -> tuple[list[int], OOMReason | None]:
        """Blocks held by a new sequence (its matched prefix, then its own run), or an OOM reason."""
        shared = self.match(hashes)
        own = need  # the run holds the whole KV; the shared prefix part of it stays unused
        i = next((k for k, (_, length) in enumerate(self.free_runs) if length >= own), None)
        if i is None:
            return [], self.oom_reason(own)
        start, length = self.free_runs.pop(i)
        if length > own:
            self.free_runs.insert(i, (start + own, length - own))
        self.runs[start] = own
        self.live_refs[start] = 0
        run = list(range(start, start + own))
        for b in run:
            self.run_of[b] = start
        held = shared + run
        for b in held:
            self.incref(b)
        #   run: [ prefix part (unused when shared) | rest of prompt | output reserve ]
        for h, b in zip(hashes[len(shared) :], run[len(shared) :], strict=False):
            self.table[h] = b
            self.hash_of[b] = h
        return held, None

    def incref(self, b: int) -> None:
        if self.ref[b] == 0:
            self.live_refs[self.run_of[b]] += 1
        self.ref[b] += 1

    def finish(self, held: list[int]) -> None:
        for b in held:
            self.ref[b] -= 1
            if self.ref[b] == 0:
                h = self.hash_of.pop(b, None)
                if h is not None:
                    del self.table[h]  # eager: a prefix block is forgotten at ref 0
                start = self.run_of[b]
                self.live_refs[start] -= 1
                if self.live_refs[start] == 0:
                    self.release_run(start)

    def release_run(self, start: int) -> None:
        length = self.runs.pop(start)
        del self.live_refs[start]
        for b in range(start, start + length):
            del self.run_of[b]
        i = bisect.bisect(self.free_runs, (start, length))
        self.free_runs.insert(i, (start, length))
        # coalesce with the right, then the left neighbour
        if i + 1 < len(self.free_runs) and start + length == self.free_runs[i + 1][0]:
            length += self.free_runs.pop(i + 1)[1]
            self.free_runs[i] = (start, length)
        if i > 0 and self.free_runs[i - 1][0] + self.free_runs[i - 1][1] == start:
            prev_start, prev_len = self.free_runs.pop(i - 1)
            self.free_runs[i - 1] = (prev_start, prev_len + length)

    def ghost_blocks(self) -> int:
        """Blocks at ref 0 inside runs that cannot be freed yet: neither free nor evictable."""
        return sum(self.runs[s] - live for s, live in self.live_refs.items())

    def free_blocks(self) -> int:
        return sum(length for _, length in self.free_runs)

    def largest_free_run(self) -> int:
        return max((length for _, length in self.free_runs), default=0)

    def oom_reason(self, own: int) -> OOMReason:
        free = self.free_blocks()
        if free >= own:
            return "no_contiguous_block"
        return "ref_count_lock" if free + self.ghost_blocks() >= own else "no_free_block"


class Report:
    """What one allocator did on the stream."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.oom_by_reason: dict[str, int] = {}
        self.ghost_max = 0
        self.frag_peak = 0.0
        self.used_peak = 0
        self.query_blocks = 0
        self.hit_blocks = 0
        self.served = 0
        self.requests_hit = 0

    def sample(self, ghost: int, free: int, largest: int) -> None:
        self.ghost_max = max(self.ghost_max, ghost)
        if free:
            self.frag_peak = max(self.frag_peak, 1.0 - largest / free)
        self.used_peak = max(self.used_peak, self.num_blocks - free)

    def as_dict(self) -> dict[str, object]:
        return {
            "oom_total": sum(self.oom_by_reason.values()),
            "oom_by_reason": dict(sorted(self.oom_by_reason.items())),
            "ghost_block_bytes_max": self.ghost_max * LAYOUT.block_bytes,
            "fragmentation_ratio_peak": round(self.frag_peak, 4),
            "prefix_hit_rate": round(self.hit_blocks / self.query_blocks, 4) if self.query_blocks else 0.0,
            "requests_served": self.served,
            "requests_with_prefix_hit": self.requests_hit,
            "peak_blocks_not_free": self.used_peak,
        }


def replay(stream: list[Request], num_blocks: int, admit, finish, observe) -> Report:  # type: ignore[no-untyped-def]
    """Discrete-event run: arrivals in order, finishes at their service end, finishes first on ties."""
    report = Report(num_blocks)
    done: list[tuple[float, int, object]] = []
    for req in stream:
        while done and done[0][0] <= req.arrival:
            _, _, handle = heapq.heappop(done)
            finish(handle)
            observe(report)
        hashes = hash_blocks(req.tokens, BLOCK_SIZE)
        handle, cached, reason = admit(req, hashes)
        report.query_blocks += len(hashes)
        if reason is not None:
            report.oom_by_reason[reason] = report.oom_by_reason.get(reason, 0) + 1
        else:
            report.served += 1
            report.hit_blocks += cached
            report.requests_hit += cached > 0
            heapq.heappush(done, (req.arrival + service_s(req, cached), req.rid, handle))
        observe(report)
    while done:
        finish(heapq.heappop(done)[2])
        observe(report)
    return report


def run_naive(stream: list[Request], num_blocks: int) -> Report:
    alloc = NaiveRunAllocator(num_blocks)

    def admit(req: Request, hashes: list[BlockHash]) -> tuple[object, int, OOMReason | None]:
        cached = len(alloc.match(hashes))
        held, reason = alloc.admit(hashes, req.blocks)
        return held, cached, reason

    def observe(report: Report) -> None:
        report.sample(alloc.ghost_blocks(), alloc.free_blocks(), alloc.largest_free_run())

    return replay(stream, num_blocks, admit, alloc.finish, observe)


def run_radixmesh(stream: list[Request], num_blocks: int) -> tuple[Report, BlockPool]:
    now = [0.0]
    config = PoolConfig(
        idle_ttl_s=10.0, gc_trigger_free_run_blocks=MAX_PROMPT // BLOCK_SIZE, gc_min_interval_s=1.0
    )
    pool = BlockPool(num_blocks, block_bytes=LAYOUT.block_bytes, config=config, clock=lambda: now[0])
    seqs = SequenceManager(PrefixCache(pool), BLOCK_SIZE)

    def admit(req: Request, hashes: list[BlockHash]) -> tuple[object, int, OOMReason | None]:
        now[0] = req.arrival
        try:
            seq = seqs.start(req.tokens, reserve_tokens=req.output_tokens)
        except OutOfBlocks as err:
            return None, 0, err.reason
        seqs.commit(seq)  # prefill wrote the prompt's KV: its full blocks become matchable
        return seq, seq.num_cached_blocks, None

    def finish(seq: BlockTable) -> None:
        seqs.release(seq)

    def observe(report: Report) -> None:
        report.sample(pool.ghost_blocks(), pool.num_free, pool.largest_free_run())

    report = replay(stream, num_blocks, admit, finish, observe)
    seqs.cache.check_invariants()
    return report, pool


def main() -> dict[str, dict[str, object]]:
    stream = request_stream()
    num_blocks = peak_demand(stream)
    naive = run_naive(stream, num_blocks)
    ours, pool = run_radixmesh(stream, num_blocks)
    assert pool.num_in_use == 0, "every sequence was released"
    return {"naive": naive.as_dict(), "radixmesh": ours.as_dict()}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results", help="folder for incident_replay.json")
    ap.add_argument("--smoke", action="store_true", help="mark the JSON as a smoke run")
    args = ap.parse_args()
    stream = request_stream()
    blocks = peak_demand(stream)
    print(f"stream: {len(stream)} requests, {len({r.prefix for r in stream})} prefixes, pool {blocks} blocks")
    result = main()
    for name, figures in result.items():
        print(f"{name:10s} " + " ".join(f"{k}={v}" for k, v in figures.items()))
    n, r = result["naive"], result["radixmesh"]
    hit_ratio = float(r["prefix_hit_rate"]) / max(float(n["prefix_hit_rate"]), 1e-9)  # type: ignore[arg-type]
    print(f"ratio prefix_hit_rate radixmesh/naive: {hit_ratio:.2f}")
    print(f"requests served radixmesh/naive: {r['requests_served']}/{n['requests_served']}")
    doc: dict[str, object] = dict(result)
    if args.smoke:
        doc["smoke"] = True
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "incident_replay.json").write_text(json.dumps(doc) + "\n")
    print(json.dumps(doc))
