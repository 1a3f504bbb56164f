"""KV transfer plane throughput: authenticated radixmesh pulls over ucxx against a raw ucxx message.

Two processes on 127.0.0.1 (UCX over TCP on the loopback device, blocking progress): an owner that
caches `max` blocks of a layout and serves them with a TransferServer, and this requester. For
pulls of 1, 16, 256 and 4,096 blocks of the default CPU model layout and of a Llama-3-8B-shaped
layout (float16, CPU memory), measured in the same run:

- pull: ``TransferClient.pull`` end to end over an authenticated channel (the handshake is done once
  per channel, as in production; request, pin, gather, send, receive into staging with the tail
  sentinel, scatter into the pool, insert into the PrefixCache), checksum "none", no MAC;
- pull_mac: the same with the keyed per-chunk MAC (BLAKE2b) computed by the owner, checked here;
- pull_crc32: the same with checksum "crc32" instead;
- raw_ucx: the baseline, the same bytes as one ucxx tagged message between preallocated buffers;
- ray: the same pull through the Ray fallback (owner in a Ray actor, payload via the object store).

Stable ratios: one trial runs every variant once (a batch of `reps` pulls each), in an order that
rotates from trial to trial, so pull and raw always share the machine's state of the moment; a
ratio is pull / raw of the same trial. Reported: the median over --trials trials (at least 5) and
its spread (min, max). Alone, best-of-N rates of pull and raw taken minutes apart gave ratios of
0.40 to 1.0 at one size on these 2 shared cores.

Also measured, to explain small blocks: the pool and cache bookkeeping per block that a pull does
outside the wire (owner: match and release; requester: allocate, insert, release), timed here
without the network, and the handshake (connect + mutual proof) per channel.

Sizes above --max-bytes (default 512 MiB, so this fits a small machine) are skipped and listed.
Prints a table, then one JSON object (also bench/results/transfer.json).
Run: ``python bench/transfer.py [--max-bytes N] [--trials T]``.
"""

import argparse
import asyncio
import functools
import json
import logging
import multiprocessing as mp
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: tests.support is a package there
from radixmesh.node_agent.memory.cache.prefix_cache import PrefixCache
from radixmesh.node_agent.memory.pool.block_pool import BlockPool
from radixmesh.node_agent.model.config import DEFAULT_CONFIG, named_config
from radixmesh.node_agent.transfer.checksum import DEFAULT_CHECKSUM
from radixmesh.node_agent.transfer.client import PullOutcome, TransferClient, TransferConfig
from radixmesh.node_agent.transfer.handshake import NodeIdentity
from radixmesh.node_agent.transfer.source import TransferSource
from radixmesh.node_agent.transfer.transport import Peer
from radixmesh.proto.block_hash import BlockHash, hash_blocks
from radixmesh.proto.events import Tier
from radixmesh.proto.ids import NodeId
from radixmesh.proto.kv_layout import KVLayout
from tests.support import transfer_owner

SIZES = (1, 16, 256, 4096)
SECRET = transfer_owner.SECRET
REQUESTER = NodeId("bench-requester")
VARIANTS = ("raw_ucx", "pull", "pull_mac", "pull_crc32", "ray")
LAYOUTS = {
    "default": named_config(DEFAULT_CONFIG).kv_layout(f"{DEFAULT_CONFIG}-seed0", 16),
    "llama3-8b": named_config("llama3-8b").kv_layout("llama3-8b", 16, "float16"),
}


def hashes_for(n: int) -> list[BlockHash]:
    return hash_blocks(np.arange(n * 16), 16)


def seeded_source(layout: KVLayout, n: int) -> TransferSource:
    """An owner caching the first `n` blocks of `hashes_for(n)`, in one run of random bytes."""
    pool = BlockPool(n, tier=Tier.HOST, block_bytes=layout.block_bytes)
    cache = PrefixCache(pool)
    kv = layout.new_cache(n)
    kv.reshape(-1).view(torch.uint8).random_(0, 256)
    blocks = pool.allocate(n, contiguous=True)
    cache.insert(hashes_for(n), blocks)
    cache.release(blocks)
    return TransferSource(cache, kv, layout)


def owner_main(conn: Connection, layout: KVLayout, n: int, node: NodeId) -> None:
    torch.set_num_threads(1)
    asyncio.run(_owner(conn, layout, n, node))


async def _owner(conn: Connection, layout: KVLayout, n: int, node: NodeId) -> None:
    from radixmesh.node_agent.transfer.server import TransferServer
    from radixmesh.node_agent.transfer.ucx_transport import import_ucxx, wire_buffer

    ucxx = import_ucxx(loopback=True)
    source = seeded_source(layout, n)
    server = TransferServer(source, "127.0.0.1", 0, secret=SECRET, node_id=node, loopback=True)
    conn.send(await server.start())
    loop = asyncio.get_running_loop()
    raw = wire_buffer(source.kv)  # the raw baseline sends straight from the cache: no gather, no checksum
    address = await loop.run_in_executor(None, conn.recv)
    ep = await ucxx.create_endpoint_from_worker_address(ucxx.get_ucx_address_from_buffer(address))
    while True:
        cmd = await loop.run_in_executor(None, conn.recv)
        if cmd is None:
            await server.stop()
            return
        nbytes, tag = cmd
        await ep.send(raw[:nbytes], tag=tag, force_tag=True)


async def rate(nbytes: int, reps: int, run: Callable[[], Awaitable[None]]) -> float:
    start = time.perf_counter()
    for _ in range(reps):
        await run()
    return nbytes * reps / (time.perf_counter() - start) / 1e9


def spread(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
            "max": round(max(values), 3)}


def bookkeeping_us_per_block(layout: KVLayout, n: int) -> float:
    """What one pulled block costs in pool and cache work on both sides, without any bytes moved:
    the owner's match (pin) and release; the requester's allocate (evicting a cached block, as a full
    pool in steady state does, and as every pull of this benchmark after the first does), insert and
    release."""
    owner = seeded_source(layout, n).cache
    mine = PrefixCache(BlockPool(n, tier=Tier.HOST, block_bytes=layout.block_bytes))
    older = hash_blocks(np.arange(n * 16) + 1, 16)  # a full pool of other cached blocks
    filled = mine.pool.allocate(n)
    mine.insert(older, filled)
    mine.release(filled)
    hashes = hashes_for(n)
    times = []
    for i in range(6):
        start = time.perf_counter()
        pinned = owner.match(hashes)
        blocks = mine.pool.allocate(n)
        mine.insert(hashes if i % 2 == 0 else older, blocks)
        mine.release(blocks)
        owner.release(pinned)
        times.append(time.perf_counter() - start)
    return statistics.median(times) / n * 1e6


async def bench_layout(name: str, layout: KVLayout, max_bytes: int, trials: int) -> dict[str, Any]:
    import ray

    from radixmesh.node_agent.transfer.ray_transport import RayTransport
    from radixmesh.node_agent.transfer.ucx_transport import UcxTransport, import_ucxx

    ray.cloudpickle.register_pickle_by_value(transfer_owner)  # Ray workers lack the repo root (tests.support) on their path
    ucxx = import_ucxx(loopback=True)
    sizes = [s for s in SIZES if s * layout.block_bytes <= max_bytes]
    n = max(sizes)
    ctx = mp.get_context("spawn")
    conn, child = ctx.Pipe()
    owner_node = NodeId(f"owner-{name}")
    owner = ctx.Process(target=owner_main, args=(child, layout, n, owner_node), daemon=True)
    owner.start()
    peer = Peer(owner_node, "127.0.0.1", conn.recv(), actor_name="")
    conn.send(ucxx.get_worker_address().tobytes())
    node = NodeId(f"bench-{name}")
    actor = transfer_owner.make_transfer_actor(node, functools.partial(seeded_source, layout, n))
    await actor.state.remote()  # ready: the actor has built its cache

    def client(checksum: str, transport: Any, mac: bool = False) -> TransferClient:
        pool = BlockPool(n, tier=Tier.HOST, block_bytes=layout.block_bytes)
        # A generous timeout: this measures throughput (the Ray path moves 512 MiB slowly), not faults.
        cfg = TransferConfig(checksum=checksum, timeout_s=600.0, mac=mac)
        kv = layout.new_cache(n)
        kv.fill_(1)  # touch every page once, as a running node's pool is: measure copies, not page faults
        return TransferClient(PrefixCache(pool), kv, layout, cfg, transport)

    identity = NodeIdentity(SECRET, REQUESTER)
    ucx = UcxTransport(identity, loopback=True)
    clients = {"pull": client(DEFAULT_CHECKSUM, ucx), "pull_mac": client(DEFAULT_CHECKSUM, ucx, mac=True),
               "pull_crc32": client("crc32", ucx), "ray": client(DEFAULT_CHECKSUM, RayTransport(identity))}
    ray_peer = Peer(node, actor_name=transfer_owner.transfer_actor_name(node))
    peers = {"pull": peer, "pull_mac": peer, "pull_crc32": peer, "ray": ray_peer}
    handshakes = []
    for _ in range(5):
        start = time.perf_counter()
        channel = await ucx.connect(peer)
        handshakes.append(time.perf_counter() - start)
        await channel.close()
    recv_buf = np.ones(n * layout.block_bytes, dtype=np.uint8)
    tags = iter(range(1, 1 << 40))
    out: dict[str, Any] = {"block_bytes": layout.block_bytes, "sizes": {}}
    for size in sizes:
        hashes = hashes_for(size)
        nbytes = size * layout.block_bytes
        reps = max(1, min(50, (64 << 20) // nbytes))

        def puller(kind: str, hashes: list[BlockHash] = hashes) -> Callable[[], Awaitable[None]]:
            async def pull_once() -> None:
                c = clients[kind]
                r = await c.pull(peers[kind], hashes)
                assert r.outcome is PullOutcome.OK and r.blocks == len(hashes), (kind, r.outcome)
                c.cache.release(r.block_ids)
            return pull_once

        async def raw(nbytes: int = nbytes) -> None:
            tag = next(tags)
            fut = asyncio.ensure_future(ucxx.recv(recv_buf[:nbytes], tag=tag))
            conn.send((nbytes, tag))
            await fut

        runs = {"raw_ucx": raw, **{kind: puller(kind) for kind in clients}}
        for run in runs.values():  # warm: endpoints, handshakes, staging, first-touch of pages
            await run()
        rates: dict[str, list[float]] = {kind: [] for kind in VARIANTS}
        for trial in range(trials):
            order = VARIANTS[trial % len(VARIANTS):] + VARIANTS[: trial % len(VARIANTS)]
            for kind in order:
                rates[kind].append(await rate(nbytes, reps, runs[kind]))
        ratios = {f"ratio_{kind}_vs_raw": spread([r / b for r, b in zip(rates[kind], rates["raw_ucx"], strict=True)])
                  for kind in VARIANTS if kind != "raw_ucx"}
        out["sizes"][str(size)] = {
            "bytes": nbytes,
            **{f"{kind}_gbps": round(statistics.median(rates[kind]), 3) for kind in VARIANTS},
            **ratios,
        }
    top = out["sizes"][str(n)]
    out["ratio_pull_vs_raw_at_max"] = top["ratio_pull_vs_raw"]
    out["ratio_pull_mac_vs_raw_at_max"] = top["ratio_pull_mac_vs_raw"]
    out["skipped_sizes"] = [s for s in SIZES if s not in sizes]
    out["handshake_ms"] = spread([h * 1e3 for h in handshakes])
    out["bookkeeping_us_per_block"] = round(bookkeeping_us_per_block(layout, n), 2)
    for c in clients.values():
        c.cache.check_invariants()
        assert c.cache.pool.num_in_use == 0
        await c.close()
    assert await actor.state.remote() == {"pinned": 0, "in_use": 0}
    ray.kill(actor)
    conn.send(None)
    owner.join(30)
    return out


async def main(max_bytes: int, trials: int) -> dict[str, Any]:
    import ray

    from radixmesh.cluster.launch.local_ray import init_loopback_ray

    init_loopback_ray(log_to_driver=False)
    try:
        layouts = {name: await bench_layout(name, layout, max_bytes, trials) for name, layout in LAYOUTS.items()}
    finally:
        ray.shutdown()
    return {
        "transport": "ucx (tcp over lo, blocking progress)",
        "checksum": DEFAULT_CHECKSUM,
        "chunk_bytes": TransferConfig().chunk_bytes,
        "max_bytes": max_bytes,
        "trials": trials,
        "layouts": layouts,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-bytes", type=int, default=512 << 20, help="largest pull measured, in bytes")
    parser.add_argument("--trials", type=int, default=7, help="interleaved trials per size (>= 5)")
    args = parser.parse_args()
    if args.trials < 5:
        parser.error("--trials must be >= 5: a median of fewer is not a stable ratio")
    logging.basicConfig(level=logging.WARNING)
    # Owner and requester share the machine's cores: torch's intra-op threads would oversubscribe
    # them (a 1 MiB block copy took 4x longer), and the raw baseline uses no torch at all.
    torch.set_num_threads(1)
    result = asyncio.run(main(args.max_bytes, args.trials))
    print(f"GB/s, medians of {args.trials} interleaved trials; ratios to raw UCX as median [min, max]")
    print(f"{'layout':10s} {'blocks':>6s} {'MiB':>8s} {'raw':>6s} {'pull':>6s} {'mac':>6s} {'crc32':>6s} {'ray':>6s} "
          f"{'pull/raw':>18s} {'mac/raw':>18s}")
    for lname, lres in result["layouts"].items():
        for size, r in lres["sizes"].items():
            p, m = r["ratio_pull_vs_raw"], r["ratio_pull_mac_vs_raw"]
            print(f"{lname:10s} {size:>6s} {r['bytes'] / 2**20:8.2f} {r['raw_ucx_gbps']:6.3f} {r['pull_gbps']:6.3f} "
                  f"{r['pull_mac_gbps']:6.3f} {r['pull_crc32_gbps']:6.3f} {r['ray_gbps']:6.3f} "
                  f"{p['median']:6.3f} [{p['min']:.2f},{p['max']:.2f}] {m['median']:6.3f} [{m['min']:.2f},{m['max']:.2f}]")
        print(f"{lname:10s} handshake {lres['handshake_ms']['median']:.2f} ms, bookkeeping "
              f"{lres['bookkeeping_us_per_block']:.1f} us/block")
    out = Path(__file__).parent / "results" / "transfer.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result) + "\n")
    print(json.dumps(result))
