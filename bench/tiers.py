"""TTFT of a prompt whose long shared prefix is served from the gpu tier, the host tier, the disk
tier, or recomputed (caching off), on CPU with SmolLM2-135M-Instruct (issue 29); and the disk
tier's read bandwidth next to a plain sequential read of a file of the same size, in the same run.

    python bench/tiers.py [--prefix 2048] [--rounds 5] [--threads 1] [--dir DIR] [--model SPEC] [--out DIR] [--smoke]

DIR is the disk tier's directory (a temporary one under /var/tmp by default). The four cases' outputs
must be equal. Prints a table; writes OUT/tiers.json (default bench/results). --smoke: the tiny seeded
model, a short prefix, small reads, marked "smoke": true. How each case and read is set up:
docs/benchmarks.md#benchtierspy.
"""

import argparse
import dataclasses
import json
import os
import platform
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from radixmesh.node_agent.engine.config import EngineConfig
from radixmesh.node_agent.engine.engine import Engine
from radixmesh.node_agent.engine.request import Request, RequestId, RequestOutput
from radixmesh.node_agent.memory.config import MemoryConfig
from radixmesh.node_agent.memory.disk.metrics import DiskStats
from radixmesh.node_agent.memory.disk.record import DiskIdentity
from radixmesh.node_agent.memory.disk.segments import SCAN_BYTES
from radixmesh.node_agent.memory.disk.tier import DiskConfig, DiskTier
from radixmesh.node_agent.model.source import SMOLLM2, resolve_model
from radixmesh.proto.block_hash import HASH_BYTES, BlockHash
from radixmesh.proto.events import Tier
from radixmesh.proto.serve.sampling import SamplingParams

RESULTS = Path(__file__).parent / "results"
SMOKE = {"model": "random-tiny", "prefix": 128, "rounds": 2, "bandwidth_mb": 4}
CASES = ("gpu", "host", "disk", "recompute")
SOURCE_OF = {"gpu": "local_gpu", "host": "local_host", "disk": "local_disk", "recompute": "computed"}
GOAL_DISK_OVER_PLAIN = 0.5


def drop_page_cache(path: Path) -> None:
    """Write `path` back and drop its pages, so the next read comes from the device."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def plain_read_s(path: Path, buffer: memoryview) -> float:
    """Seconds to read `path` start to end in buffer-sized reads (what `cat` does), cache dropped."""
    drop_page_cache(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        t0 = time.perf_counter()
        while os.readv(fd, [buffer]):
            pass
        return time.perf_counter() - t0
    finally:
        os.close(fd)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prefix", type=int, default=2048, help="shared prefix tokens (whole blocks)")
    p.add_argument("--suffix", type=int, default=8, help="fresh tokens per prompt (under a block)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: steady on shared cores)")
    p.add_argument("--bandwidth-mb", type=int, default=256, help="size of the bandwidth reads")
    p.add_argument("--dir", type=Path, default=None, help="disk tier directory (default: a temporary one)")
    p.add_argument("--model", default=SMOLLM2, help="model spec (resolve_model)")
    p.add_argument("--out", type=Path, default=RESULTS, help="folder for tiers.json")
    p.add_argument("--smoke", action="store_true", help=f"tiny run: {SMOKE}")
    a = p.parse_args()
    if a.smoke:  # smaller defaults; sizes given on the command line still win
        p.set_defaults(**SMOKE)
        a = p.parse_args()
    block_size = EngineConfig().block_size
    if a.prefix % block_size or not 0 < a.suffix < block_size:
        p.error(f"--prefix must be whole blocks of {block_size} tokens and 0 < --suffix < {block_size}")
    torch.set_num_threads(a.threads)
    t_start = time.perf_counter()
    load_before = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="radixmesh-tiers-", dir=a.dir or "/var/tmp"))
    try:
        result = run(a, work, block_size)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["machine"] = {"platform": platform.platform(), "processor": platform.processor(),
                         "cpus": os.cpu_count(), "torch_threads": a.threads,
                         "load_avg_before": load_before, "load_avg_after": os.getloadavg()}
    result["wall_s"] = round(time.perf_counter() - t_start, 1)
    if a.smoke:
        result["smoke"] = True
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "tiers.json").write_text(json.dumps(result, indent=2) + "\n")


def run(a: argparse.Namespace, work: Path, block_size: int) -> dict[str, object]:
    source = resolve_model(a.model)
    model = source.load()
    blocks = a.prefix // block_size
    disk_dir = work / "disk"
    tiered = MemoryConfig(num_gpu_blocks=4 * blocks, num_host_blocks=4 * blocks,
                          disk=DiskConfig(disk_dir, capacity_bytes=8 << 30))
    engines = {
        "tiered": Engine(model, EngineConfig(model_id=source.identity(), memory=tiered), clock=time.perf_counter),
        "off": Engine(model, EngineConfig(model_id=source.identity(),
                                          memory=MemoryConfig(num_gpu_blocks=4 * blocks, enable_prefix_caching=False)),
                      clock=time.perf_counter),
    }
    engine = engines["tiered"]
    memory = engine.memory

    def disk_stats() -> DiskStats:
        stats = memory.disk_stats()
        assert stats is not None, "the tiered engine has a disk tier"
        return stats
    rng = random.Random(0)
    # Token ids below 256 exist in every vocabulary; the engine never detokenizes them.
    prefix = [rng.randrange(256) for _ in range(a.prefix)]
    params = SamplingParams(max_tokens=4, ignore_eos=True)

    def prompt(name: str) -> Request:
        return Request(RequestId(name), tuple(prefix + [rng.randrange(256) for _ in range(a.suffix)]), params)

    for e in engines.values():
        e.generate([prompt("warm")])
    prefix_bytes = blocks * engine.layout.block_bytes
    block_bytes = engine.layout.block_bytes
    chain_blocks = max(1, (a.bandwidth_mb << 20) // block_bytes)
    chain = [BlockHash(rng.randbytes(HASH_BYTES)) for _ in range(chain_blocks)]
    chain_dir = work / "chain"
    chain_tier = DiskTier(DiskConfig(chain_dir, capacity_bytes=4 * (a.bandwidth_mb << 20) + (256 << 20)),
                          DiskIdentity.of(engine.layout, b""))
    ends = {}  # the first and last blocks' bytes, to check the reads return them
    for k, (parent, h) in enumerate(zip([None, *chain], chain)):
        payload = rng.randbytes(block_bytes)
        if k in (0, chain_blocks - 1):
            ends[k] = payload
        chain_tier.offer(h, payload, parent=parent)
    chain_tier.flush()
    # Where the reads land, like the host tier's KV tensor: allocated (and zeroed) once.
    blocks_into = torch.zeros((chain_blocks, block_bytes), dtype=torch.uint8)
    into = [row.numpy().data for row in blocks_into]
    chain_bytes = chain_blocks * block_bytes
    plain = work / "plain.bin"
    with plain.open("wb") as f:
        for _ in range(0, chain_bytes, SCAN_BYTES):
            f.write(rng.randbytes(min(SCAN_BYTES, chain_bytes - f.tell())))
    buffer = memoryview(bytearray(SCAN_BYTES))

    def tier_read_s(cold: bool = True) -> float:
        for segment in chain_dir.iterdir() if cold else ():
            drop_page_cache(segment)
        blocks_into[[0, -1]] = 0
        t0 = time.perf_counter()
        got = chain_tier.get_run_into(chain, into)
        elapsed = time.perf_counter() - t0
        assert got == chain_blocks, f"the chain read {got} of {chain_blocks} blocks"
        assert all(into[k] == payload for k, payload in ends.items()), "the chain read other bytes"
        return elapsed

    ttft: dict[str, list[float]] = {c: [] for c in CASES}
    case_gbps: list[float] = []
    disk_gbps: list[float] = []
    warm_gbps: list[float] = []
    plain_gbps: list[float] = []
    for i in range(a.rounds):
        request = prompt(f"r{i}")
        outputs: dict[str, RequestOutput] = {}
        for case in CASES[i % len(CASES):] + CASES[: i % len(CASES)]:
            if case == "host":
                memory.evict(Tier.GPU)
            elif case == "disk":
                # evict gpu and host only: a prefix-cache reset also empties the disk tier (issue 38)
                memory.evict(Tier.GPU)
                memory.evict(Tier.HOST)
                memory.flush_disk()
                for segment in disk_dir.iterdir():
                    drop_page_cache(segment)
            before = disk_stats()
            served = Request(RequestId(f"{request.request_id}-{case}"), request.prompt_token_ids, params)
            out = engines["off" if case == "recompute" else "tiered"].generate([served])[0]
            outputs[case] = out
            sources = out.stats.sources
            assert sources is not None
            expected = a.prefix if case != "recompute" else a.prefix + a.suffix
            assert getattr(sources, SOURCE_OF[case]) == expected, f"{case}: {sources}"
            ttft[case].append(out.stats.ttft_s or 0.0)
            if case == "disk":
                after = disk_stats()
                got = after.disk_read_bytes - before.disk_read_bytes
                assert got == prefix_bytes, f"the disk case read {got} bytes, not the prefix's {prefix_bytes}"
                case_gbps.append(got / (after.disk_read_seconds - before.disk_read_seconds) / 1e9)
        assert len({tuple(o.output_token_ids) for o in outputs.values()}) == 1, "outputs differ between cases"
        # Alternate which read goes first, so neither always follows the other's writeback.
        reads = [("tier", tier_read_s), ("plain", lambda: plain_read_s(plain, buffer))]
        for name, read in reads if i % 2 == 0 else reads[::-1]:
            (disk_gbps if name == "tier" else plain_gbps).append(chain_bytes / read() / 1e9)
        warm_gbps.append(chain_bytes / tier_read_s(cold=False) / 1e9)
    chain_tier.close()
    for e in engines.values():
        e.check_invariants()
    final_disk = disk_stats()

    medians = {c: statistics.median(v) for c, v in ttft.items()}
    ratio = statistics.median(disk_gbps) / statistics.median(plain_gbps)
    table = Table(title=f"TTFT, {a.prefix}-token prefix + {a.suffix} tokens, {a.model} on CPU "
                        f"({a.threads} thread(s)), median of {a.rounds}")
    for col in ("prefix served from", "TTFT ms", "/ recompute", "runs ms"):
        table.add_column(col, justify="left" if col == "prefix served from" else "right")
    for c in CASES:
        table.add_row(c, f"{medians[c] * 1e3:.1f}", f"{medians[c] / medians['recompute']:.3f}",
                      " ".join(f"{t * 1e3:.0f}" for t in ttft[c]))
    console = Console(width=120)
    console.print(table)
    console.print(f"disk read {statistics.median(disk_gbps):.2f} GB/s (the tier's get_run_into) vs plain sequential read "
                  f"{statistics.median(plain_gbps):.2f} GB/s, {chain_bytes / 1e6:.0f} MB each, page cache dropped: "
                  f"{ratio:.2f}x (goal >= {GOAL_DISK_OVER_PLAIN}x); the tier's read with the pages cached "
                  f"{statistics.median(warm_gbps):.2f} GB/s; inside the disk case "
                  f"({prefix_bytes / 1e6:.0f} MB): {statistics.median(case_gbps):.2f} GB/s")
    return {
        "model": a.model, "prefix_tokens": a.prefix, "suffix_tokens": a.suffix, "rounds": a.rounds,
        "block_bytes": engine.layout.block_bytes, "prefix_bytes": prefix_bytes,
        "ttft_s": ttft, "ttft_median_s": medians,
        "ttft_over_recompute": {c: medians[c] / medians["recompute"] for c in CASES},
        "bandwidth_read_bytes": chain_bytes, "disk_read_gbps": disk_gbps, "plain_read_gbps": plain_gbps,
        "disk_over_plain": ratio, "disk_read_warm_gbps": warm_gbps, "disk_case_read_gbps": case_gbps,
        "goal_disk_over_plain": GOAL_DISK_OVER_PLAIN, "met": ratio >= GOAL_DISK_OVER_PLAIN,
        "disk_dir_filesystem": _filesystem(work),
        "disk_stats": dataclasses.asdict(final_disk),
    }


def _filesystem(path: Path) -> str:
    """The mount (device and type) `path` lies on, as /proc/mounts names it."""
    best = ("", "?", "?")
    for line in Path("/proc/mounts").read_text().splitlines():
        dev, mount, fstype, *_ = line.split()
        if str(path).startswith(mount) and len(mount) >= len(best[0]):
            best = (mount, dev, fstype)
    return f"{best[1]} ({best[2]}) at {best[0]}"


if __name__ == "__main__":
    main()
