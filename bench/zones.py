"""Zone policies of one node's pool under our production zone pressure: today's single pool
(`shared`), a fixed kv/prefix split (`fixed`) and watermark borrowing (`borrow`), in one run.

    python bench/zones.py [--requests 1500] [--slo 0.5] [--rate 14] [--seed 0] [--out DIR] [--smoke]

A node serves requests on the real BlockPool, PrefixCache and ZoneGovernor with simulated step times.
For each policy: the highest arrival rate whose TTFT p99 stays under the SLO, and there hit rate, OOMs
and preemptions; plus every policy at one common rate; ratios against `shared`. The workload and how
it was tuned to production's pressure: docs/benchmarks.md#benchzonespy.
Last line: JSON, also in DIR/zones.json (default bench/results). A smoke run sweeps the same with 60
requests per run.
"""

import argparse
import json
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

from radixmesh.cluster.bench.schedule import poisson_times
from radixmesh.common.block_pool.block_pool import BlockPool, OutOfBlocks
from radixmesh.common.block_pool.config import PoolConfig
from radixmesh.common.prefix_cache.prefix_cache import PrefixCache
from radixmesh.node_agent.memory.zones.budget import ZoneConfig, ZoneName
from radixmesh.node_agent.memory.zones.governor import ZoneGovernor, ZoneSetup
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.ids import BlockId

RESULTS = Path(__file__).resolve().parent / "results"
POLICIES = ("shared", "fixed", "borrow")
BLOCK = 16  # tokens per block
POOL_BLOCKS = 1024
KV_FRACTION = 0.6
TOKEN_BUDGET = 2048  # prefill tokens per step
MAX_SEQS = 64
STEP_S = 0.008  # fixed cost of a step
PREFILL_S = 4e-5  # per prefill token (25k tokens/s)
DECODE_S = 2e-4  # per sequence in the decode batch
GROUPS = 24
IDLE_TTL_S = 0.5
SMOKE_REQUESTS = 60


@dataclass(slots=True)
class Req:
    arrival: float
    group: int
    sys_blocks: int
    own_blocks: int
    output: int
    serial: int
    blocks: list[BlockId] = field(default_factory=list)
    generated: int = 0
    computed: bool = False
    first_token: float | None = None
    hit_blocks: int | None = None

    def hashes(self) -> list[BlockHash]:
        sys = [BlockHash(bytes([1, self.group]) + i.to_bytes(14, "little")) for i in range(self.sys_blocks)]
        own = [BlockHash(bytes([2]) + self.serial.to_bytes(8, "little") + i.to_bytes(7, "little"))
               for i in range(self.own_blocks)]
        return sys + own

    @property
    def prompt_blocks(self) -> int:
        return self.sys_blocks + self.own_blocks


def workload(n: int, rate: float, seed: int) -> list[Req]:
    rng = random.Random(seed)
    weights = [1 / (g + 1) ** 1.1 for g in range(GROUPS)]
    sys_len = [rng.randint(6, 24) for _ in range(GROUPS)]
    out: list[Req] = []
    # the arrival gaps come from the same rng, each drawn just before its request's group and lengths
    for i, t in zip(range(n), poisson_times(rate, rng), strict=False):
        g = rng.choices(range(GROUPS), weights)[0]
        out.append(Req(t, g, sys_len[g], rng.randint(1, 4), rng.randint(112, 208), i))
    return out


@dataclass(slots=True)
class Run:
    policy: str
    rate: float
    served: int = 0
    seconds: float = 0.0
    ttft: list[float] = field(default_factory=list)
    prompt_blocks: int = 0
    hit_blocks: int = 0
    ooms: int = 0
    preemptions: int = 0
    kv_w: list[float] = field(default_factory=list)
    prefix_w: list[float] = field(default_factory=list)
    fragmentation: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, float]:
        tt = sorted(self.ttft)
        p99 = tt[min(len(tt) - 1, math.ceil(0.99 * len(tt)) - 1)] if tt else math.inf
        return {"rate": self.rate, "throughput_rps": self.served / self.seconds, "ttft_p99_s": p99,
                "hit_rate": self.hit_blocks / max(self.prompt_blocks, 1), "ooms": self.ooms,
                "preemptions": self.preemptions,
                "kv_w_mean": sum(self.kv_w) / len(self.kv_w), "kv_w_peak": max(self.kv_w),
                "prefix_w_mean": sum(self.prefix_w) / len(self.prefix_w), "prefix_w_peak": max(self.prefix_w),
                "fragmentation_mean": sum(self.fragmentation) / len(self.fragmentation)}


def simulate(policy: str, reqs: list[Req], rate: float, *, weak: bool = True) -> Run:
    """One run. `weak`: a finished request's prompt blocks stay matchable as weak references (cached,
    ref 0: reclaimed the moment an allocation needs them); False: the prefix cache holds them strongly
    (one reference each) until two-phase GC's idle TTL expires, as a cache that owns its blocks would."""
    now = [0.0]
    pool = BlockPool(POOL_BLOCKS, config=PoolConfig(idle_ttl_s=IDLE_TTL_S), clock=lambda: now[0])
    cache = PrefixCache(pool)
    gov = ZoneGovernor(pool, ZoneSetup(policy=policy, kv_fraction=KV_FRACTION,
                                       watermarks=ZoneConfig(borrow_step=0.05, borrow_interval_s=0.25)),
                       clock=lambda: now[0])
    kv_base = gov.budget[ZoneName.KV].base
    prefix_base = gov.budget[ZoneName.PREFIX].base
    run = Run(policy, rate)
    pending = [Req(r.arrival, r.group, r.sys_blocks, r.own_blocks, r.output, r.serial) for r in reqs]
    pending.reverse()
    waiting: list[Req] = []
    running: list[Req] = []
    next_tick = 1.0
    strong: list[tuple[float, list[BlockId]]] = []  # (released at, blocks) the cache holds, oldest first
    while pending or waiting or running:
        while pending and pending[-1].arrival <= now[0]:
            waiting.append(pending.pop())
        if not waiting and not running:
            now[0] = pending[-1].arrival
            continue
        # Decode first: each running sequence grows by one token; a block boundary needs a block.
        decoding = [r for r in running if r.computed]
        for r in list(decoding):
            if r not in running:
                continue
            tokens = r.prompt_blocks * BLOCK + r.generated + 1
            while len(r.blocks) * BLOCK < tokens:
                try:
                    r.blocks += pool.allocate(1)
                except OutOfBlocks:
                    run.ooms += 1
                    victim = running[-1]
                    _preempt(cache, victim, running, waiting)
                    run.preemptions += 1
                    if victim is r:
                        break
            else:
                r.generated += 1
        # Admit waiting requests (FIFO) within the token budget.
        budget, prefilled = TOKEN_BUDGET, 0
        while waiting and len(running) < MAX_SEQS:
            r = waiting[0]
            hashes = r.hashes()
            hit = cache.match(hashes[: r.prompt_blocks - 1])
            need = (r.prompt_blocks - len(hit)) * BLOCK
            if need > budget:
                cache.release(hit)
                break
            try:
                new = pool.allocate(r.prompt_blocks + 1 - len(hit))
            except OutOfBlocks:
                run.ooms += 1
                cache.release(hit)
                break
            waiting.pop(0)
            r.blocks = hit + new
            if r.hit_blocks is None:
                r.hit_blocks = len(hit)
            budget -= need
            prefilled += need
            cache.insert(hashes[len(hit):], r.blocks[len(hit): r.prompt_blocks], hashes[len(hit) - 1] if hit else None)
            r.computed = True
            running.append(r)
        dt = STEP_S + PREFILL_S * prefilled + DECODE_S * len(decoding)
        now[0] += dt
        for r in running:
            if r.computed and r.first_token is None and r.generated == 0 and r not in decoding:
                r.first_token = now[0]
                run.ttft.append(now[0] - r.arrival)
        for r in [r for r in running if r.generated >= r.output]:
            running.remove(r)
            if not weak:
                held = [b for b in r.blocks[: r.prompt_blocks] if pool.hash_of(b) is not None]
                pool.incref(held)
                strong.append((now[0], held))
            cache.release(r.blocks)
            run.served += 1
            run.prompt_blocks += r.prompt_blocks
            run.hit_blocks += r.hit_blocks or 0
        gov.after_step(0)
        if now[0] >= next_tick:
            next_tick += 1.0
            while strong and strong[0][0] <= now[0] - IDLE_TTL_S:
                cache.release(strong.pop(0)[1])
            pool.gc()
            free = pool.num_free
            run.fragmentation.append(1 - pool.largest_free_run() / free if free else 0.0)
            run.kv_w.append(pool.num_in_use / kv_base)
            run.prefix_w.append(pool.num_cached / prefix_base)
    for _, held in strong:
        cache.release(held)
    run.seconds = now[0]
    cache.check_invariants()
    assert pool.ghost_blocks() == 0
    return run


def _preempt(cache: PrefixCache, victim: Req, running: list[Req], waiting: list[Req]) -> None:
    """Recompute-preempt the youngest running sequence: its blocks go back (prompt blocks stay cached)."""
    running.remove(victim)
    cache.release(victim.blocks)
    victim.blocks, victim.generated, victim.computed = [], 0, False
    waiting.insert(0, victim)


def max_rate(policy: str, n: int, slo: float, seed: int, lo: float = 4.0, hi: float = 24.0) -> tuple[float, Run]:
    """Highest arrival rate (req/s) with TTFT p99 <= slo, by bisection (8 halvings)."""
    best = simulate(policy, workload(n, lo, seed), lo)
    for _ in range(8):
        mid = (lo + hi) / 2
        r = simulate(policy, workload(n, mid, seed), mid)
        if r.summary()["ttft_p99_s"] <= slo:
            lo, best = mid, r
        else:
            hi = mid
    return lo, best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=1500)
    ap.add_argument("--slo", type=float, default=0.5, help="TTFT p99 bound, simulated seconds")
    ap.add_argument("--rate", type=float, default=14.0, help="common rate for the side-by-side: where "
                    "the zone pressure follows production (kv W mean ~0.78, prefix ~0.43 under borrowing)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=RESULTS, help="folder for zones.json")
    ap.add_argument("--smoke", action="store_true", help=f"tiny run: {SMOKE_REQUESTS} requests")
    args = ap.parse_args()
    if args.smoke:  # smaller defaults; sizes given on the command line still win
        ap.set_defaults(requests=SMOKE_REQUESTS)
        args = ap.parse_args()
    t0 = time.perf_counter()
    at_slo = {p: max_rate(p, args.requests, args.slo, args.seed) for p in POLICIES}
    common = args.rate
    same_rate = {p: simulate(p, workload(args.requests, common, args.seed), common).summary() for p in POLICIES}
    base_rate = at_slo["shared"][0]
    base_hit = same_rate["shared"]["hit_rate"]
    print(f"{'policy':<8}{'req/s @SLO':>11}{'/shared':>8}{'hit rate':>9}{'/shared':>8}{'OOMs':>7}{'preempt':>8}"
          f"{'kv W mean/peak':>16}{'prefix W mean/peak':>20}")
    out: dict[str, object] = {"requests": args.requests, "slo_ttft_p99_s": args.slo, "common_rate": common,
                              "target_pressure": {"kv_mean": 0.78, "kv_peak": 0.94, "prefix_mean": 0.42,
                                                  "prefix_peak": 0.61}, "policies": {}}
    for p in POLICIES:
        rate, _ = at_slo[p]
        s = same_rate[p]
        print(f"{p:<8}{rate:>11.2f}{rate / base_rate:>8.3f}{s['hit_rate']:>9.3f}{s['hit_rate'] / base_hit:>8.3f}"
              f"{s['ooms']:>7}{s['preemptions']:>8}{s['kv_w_mean']:>8.2f}/{s['kv_w_peak']:<7.2f}"
              f"{s['prefix_w_mean']:>11.2f}/{s['prefix_w_peak']:<8.2f}")
        out["policies"][p] = {"max_rate_at_slo": rate, "rate_ratio_vs_shared": rate / base_rate,  # type: ignore[index]
                              "at_slo": at_slo[p][1].summary(), "at_common_rate": s}
    # Weak vs strong references to cached prefix blocks (shared pool), at the common rate and at the
    # shared pool's highest rate within the SLO, where memory is tight.
    refs: dict[str, dict[str, dict[str, float]]] = {}
    for rate in (common, base_rate):
        wl = workload(args.requests, rate, args.seed)
        pair = refs[f"{rate:.2f}"] = {"weak": simulate("shared", wl, rate).summary(),
                                      "strong": simulate("shared", wl, rate, weak=False).summary()}
        print(f"\nprefix blocks as weak vs strong references (shared pool, {rate:.2f} req/s):")
        for kind, s in pair.items():
            print(f"  {kind:<7} hit rate {s['hit_rate']:.3f}  OOMs {s['ooms']:>5}  preemptions {s['preemptions']:>4}  "
                  f"TTFT p99 {s['ttft_p99_s']:.3f} s  fragmentation mean {s['fragmentation_mean']:.3f}")
    out["references"] = refs
    best = max(POLICIES, key=lambda p: (at_slo[p][0], same_rate[p]["hit_rate"]))
    out["best"] = best
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    if args.smoke:
        out["smoke"] = True
    print(f"side by side at {common:.2f} req/s (hit rate, OOMs, W); best at the SLO: {best}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "zones.json").write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
