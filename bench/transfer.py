"""KV transfer plane throughput beside the peers built for the job: same bytes, same run, loopback.

Moves 64 KiB to 256 MiB between two processes four ways, GB/s: a plain TCP socket, Mooncake Transfer
Engine (bench-only, when installed), one raw ucxx message, and our pull on the production path with
both engines busy (plus `--mac`: the pull with every chunk MAC'd). Medians over --trials rotated
trials, each ratio within one trial. Every column's setup: docs/benchmarks.md#benchtransferpy.

    python bench/transfer.py [--max-bytes N] [--trials T] [--mac] [--out DIR] [--smoke]

The configuration before issue 25 (an operator's UCX_* values win over ucx_env()) is measured with
``UCX_TLS=tcp,self UCX_MM_ERROR_HANDLING=n UCX_TCP_TX_SEG_SIZE=8K UCX_TCP_RX_SEG_SIZE=64K
UCX_MM_FIFO_SIZE=256 python bench/transfer.py``.

Prints a table, then writes OUT/transfer.json (--out, bench/results by default) with the machine's
description. --smoke measures 64 KiB only and marks the result "smoke": true.
"""

import argparse
import asyncio
import importlib
import json
import logging
import multiprocessing as mp
import os
import platform
import socket
import statistics
import time
from collections.abc import Awaitable, Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transfer_agents import (
    BLOCK_BYTES,
    OWNER,
    SPARE_BLOCKS,
    BusyAgent,
    busy_since,
    busy_state,
    hashes_for,
    land,
    owner_main,
)
from transfer_peer import peer_main

from radixmesh.node_agent.memory.node_memory import allocate_up_to
from radixmesh.node_agent.transfer.plane import TransferPlane
from radixmesh.proto.ids import NodeId

SIZES = (64 << 10, 1 << 20, 16 << 20, 256 << 20)
COLUMNS = ("socket", "mooncake", "raw_ucxx", "pull", "pull_mac")
PULLS = ("pull", "pull_mac")
BUSY_REQUESTS = 2
"""Requests the engine of each agent keeps decoding while pulls run (--busy)."""
REQUESTER = NodeId("bench-requester")
CTX = mp.get_context("spawn")


# --- the requester: one transfer of each column ----------------------------------------------
class Columns:
    """This process's end of every column; `run[column](nbytes)` moves nbytes once."""

    def __init__(self, max_bytes: int, peer_conn: Connection, owner_address: str, agent: BusyAgent) -> None:
        self.dst = np.zeros(max_bytes, dtype=np.uint8)
        self.dst.fill(1)  # touched once: measure copies, not page faults
        self.peer = peer_conn
        self.agent = agent
        self.owner_address = owner_address
        self.tags = iter(range(1, 1 << 40))
        self.skipped: dict[str, str] = {}
        self.sock: socket.socket | None = None
        self.mooncake: Any = None
        self.mooncake_target = ""
        self.mooncake_remote = 0
        self.ucxx: Any = None
        self.stream_s = 0.0
        """Seconds spent in TransferPlane.receive."""
        self.jobs_s = 0.0
        """Seconds spent waiting for this engine's allocate and land jobs."""

    async def connect(self, socket_port: int, mooncake: tuple[int, int] | str) -> None:
        from radixmesh.node_agent.transfer.ucx_transport import import_ucxx

        self.sock = socket.create_connection(("127.0.0.1", socket_port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if isinstance(mooncake, str):
            self.skipped["mooncake"] = mooncake
        else:
            engine = importlib.import_module("mooncake.engine").TransferEngine()
            rc = engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "")
            rc = rc or engine.register_memory(self.dst.ctypes.data, self.dst.nbytes)
            if rc:
                self.skipped["mooncake"] = f"requester's TransferEngine failed to start ({rc})"
            self.mooncake, self.mooncake_target = engine, f"127.0.0.1:{mooncake[0]}"
            self.mooncake_remote = mooncake[1]
        self.ucxx = import_ucxx(loopback=True)
        self.peer.send(self.ucxx.get_worker_address().tobytes())
        await asyncio.get_running_loop().run_in_executor(None, self.peer.recv)

    async def socket(self, nbytes: int) -> None:
        assert self.sock is not None
        s, view = self.sock, self.dst.data[:nbytes]
        s.sendall(nbytes.to_bytes(8, "little"))
        got = 0
        while got < nbytes:
            got += s.recv_into(view[got:], nbytes - got)

    async def mooncake_read(self, nbytes: int) -> None:
        rc = self.mooncake.transfer_sync_read(self.mooncake_target, self.dst.ctypes.data, self.mooncake_remote,
                                              nbytes)
        assert rc == 0, f"transfer_sync_read returned {rc}"

    async def raw_ucxx(self, nbytes: int) -> None:
        from radixmesh.node_agent.transfer import ucx_progress

        tag = next(self.tags)
        received = ucx_progress.post_recv(self.ucxx, self.dst[:nbytes], tag)
        self.peer.send((nbytes, tag))
        await received

    async def pull(self, nbytes: int) -> None:
        await self._pull(self.agent.plane, nbytes)

    async def pull_mac(self, nbytes: int) -> None:
        assert self.agent.mac_plane is not None
        await self._pull(self.agent.mac_plane, nbytes)

    async def _pull(self, plane: TransferPlane, nbytes: int) -> None:
        """Allocate (an engine job), stream (TransferPlane.receive: off the engine thread), land (an
        engine job), as the agent's serve does; the stream alone is timed too (`stream_s`)."""
        hashes = hashes_for(nbytes // BLOCK_BYTES)
        tier = self.agent.tier
        start = time.perf_counter()
        blocks = await self.agent.runner.call(allocate_up_to, tier.pool, len(hashes))
        streaming = time.perf_counter()
        self.jobs_s += streaming - start
        received = 0
        try:
            pulled = await plane.receive(OWNER, self.owner_address, hashes, blocks)
            received = len(pulled.block_ids)
        finally:
            landing = time.perf_counter()
            self.stream_s += landing - streaming
            await self.agent.runner.call(land, tier, hashes, blocks, received)
            self.jobs_s += time.perf_counter() - landing
        assert not pulled.failed and received == len(hashes), pulled

    def runs(self) -> dict[str, Callable[[int], Awaitable[None]]]:
        every = {"socket": self.socket, "mooncake": self.mooncake_read, "raw_ucxx": self.raw_ucxx,
                 "pull": self.pull, "pull_mac": self.pull_mac}
        if self.agent.mac_plane is None:
            self.skipped["pull_mac"] = "run with --mac"
        return {k: v for k, v in every.items() if k not in self.skipped}


async def rate(nbytes: int, reps: int, run: Callable[[int], Awaitable[None]]) -> float:
    start = time.perf_counter()
    for _ in range(reps):
        await run(nbytes)
    return nbytes * reps / (time.perf_counter() - start) / 1e9


def spread(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
            "max": round(max(values), 3)}


async def measure(max_bytes: int, trials: int, busy: int, mac: bool) -> dict[str, Any]:
    sizes = [s for s in SIZES if s <= max_bytes]
    top = max(sizes)
    peer_conn, child = CTX.Pipe()
    peer = CTX.Process(target=peer_main, args=(child, top), daemon=True)
    peer.start()
    owner_conn, owner_child = CTX.Pipe()
    owner = CTX.Process(target=owner_main, args=(owner_child, top // BLOCK_BYTES, busy), daemon=True)
    owner.start()
    loop = asyncio.get_running_loop()
    socket_port, mooncake = await loop.run_in_executor(None, peer_conn.recv)
    owner_address = await loop.run_in_executor(None, owner_conn.recv)
    agent = await BusyAgent.start(REQUESTER, top // BLOCK_BYTES + SPARE_BLOCKS, busy, mac)
    cols = Columns(top, peer_conn, owner_address, agent)
    await cols.connect(socket_port, mooncake)
    runs = cols.runs()
    busy_from = busy_state(agent)
    out: dict[str, Any] = {"sizes": {}, "skipped_columns": cols.skipped,
                           "skipped_sizes": [s for s in SIZES if s not in sizes]}
    for size in sizes:
        reps = max(1, min(20, (32 << 20) // size))
        for run in runs.values():  # warm: connections, endpoints, staging, first touch
            await run(size)
        rates: dict[str, list[float]] = {c: [] for c in runs}
        stream: dict[str, list[float]] = {c: [] for c in PULLS if c in runs}
        jobs_ms: list[float] = []
        names = list(runs)
        for trial in range(trials):
            for c in names[trial % len(names):] + names[: trial % len(names)]:
                cols.stream_s = cols.jobs_s = 0.0
                rates[c].append(await rate(size, reps, runs[c]))
                if c in stream:
                    stream[c].append(size * reps / cols.stream_s / 1e9)
                if c == "pull":
                    jobs_ms.append(cols.jobs_s / reps * 1e3)
        row: dict[str, Any] = {"bytes": size, "reps": reps}
        for c in runs:
            row[c] = spread(rates[c])
        for c, values in stream.items():
            row[f"{c}_stream"] = spread(values)
        row["pull_engine_jobs_ms"] = spread(jobs_ms)
        for c in stream:
            for base in ("socket", "mooncake", "raw_ucxx", "pull"):
                if base in runs and base != c:
                    row[f"{c}_vs_{base}"] = spread([p / b for p, b in zip(rates[c], rates[base], strict=True)])
        out["sizes"][str(size)] = row
        agent.check()
        print(f"{size >> 10:>8d} KiB  " + "  ".join(f"{c} {row[c]['median']:.3f}" for c in runs), flush=True)
    out["busy_engines"] = {"requester": busy_since(agent, busy_from)}
    await agent.stop()
    owner_conn.send(None)
    out["busy_engines"]["owner"] = await loop.run_in_executor(None, owner_conn.recv)
    peer_conn.send(None)
    owner.join(30)
    peer.join(10)
    return out


def machine() -> dict[str, Any]:
    import ucxx

    from radixmesh.node_agent.transfer.ucx_env import ucx_env

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    try:
        from importlib.metadata import version
        mooncake = version("mooncake-transfer-engine-non-cuda")
    except Exception as e:  # noqa: BLE001  (only described)
        mooncake = f"missing ({e.__class__.__name__})"
    return {"cpu": cpu, "cores": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
            "load_avg_at_start": os.getloadavg(), "torch": torch.__version__, "ucxx": ucxx.__version__,
            "ucx_env": {k: os.environ.get(k, v) for k, v in ucx_env(loopback=True).items()},
            "ucx_env_overrides": {k: v for k, v in os.environ.items() if k.startswith("UCX")
                                  and k not in ucx_env(loopback=True)},
            "mooncake": mooncake, "note": "shared machine: other engineers' tests ran beside this benchmark"}


def print_table(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    engines = f"engines busy with {result['busy_requests']} requests each" if result["busy_requests"] else "engines idle"
    table = Table(title=f"GB/s, medians of {result['trials']} interleaved trials [min-max]; pull: {engines}")
    for col in ("size", *COLUMNS, "pull/socket", "pull/mooncake", "pull/raw_ucxx", "pull_mac/raw_ucxx",
                "pull_mac/pull", "stream only", "jobs ms/pull"):
        table.add_column(col, justify="right")
    for size, row in result["sizes"].items():
        n = int(size)
        label = f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"
        cells = [label]
        for c in COLUMNS:
            cells.append(f"{row[c]['median']:.2f} [{row[c]['min']:.2f}-{row[c]['max']:.2f}]" if c in row else "skipped")
        for ratio in ("pull_vs_socket", "pull_vs_mooncake", "pull_vs_raw_ucxx", "pull_mac_vs_raw_ucxx",
                      "pull_mac_vs_pull"):
            r = row.get(ratio)
            cells.append(f"{r['median']:.2f}x [{r['min']:.2f}-{r['max']:.2f}]" if r else "-")
        st = row["pull_stream"]
        cells.append(f"{st['median']:.2f} [{st['min']:.2f}-{st['max']:.2f}]")
        cells.append(f"{row['pull_engine_jobs_ms']['median']:.1f}")
        table.add_row(*cells)
    console = Console(width=200)
    console.print(table)
    for col, why in result["skipped_columns"].items():
        console.print(f"{col} skipped: {why}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-bytes", type=int, default=256 << 20, help="largest transfer measured, in bytes")
    parser.add_argument("--trials", type=int, default=5, help="interleaved trials per size (>= 5)")
    parser.add_argument("--busy", type=int, default=BUSY_REQUESTS,
                        help="requests each agent's engine keeps decoding (0: idle engines, not the production path)")
    parser.add_argument("--mac", action="store_true",
                        help="also measure pull_mac: the pull with every chunk MAC'd (PullConfig.mac)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results", help="folder of transfer.json")
    parser.add_argument("--smoke", action="store_true",
                        help="the smallest size only, so the bench cannot rot (not a measurement)")
    args = parser.parse_args()
    if args.trials < 5:
        parser.error("--trials must be >= 5: a median of fewer is not a stable ratio")
    if args.smoke:  # every column and both busy engines still run; the startup is most of the time
        args.max_bytes = SIZES[0]
    logging.basicConfig(level=logging.WARNING)
    # Every process shares the machine's cores: torch's intra-op threads would oversubscribe them.
    torch.set_num_threads(1)
    desc = machine()
    start = time.perf_counter()
    result = {"machine": desc, "trials": args.trials, "block_bytes": BLOCK_BYTES, "busy_requests": args.busy,
              "mac": args.mac, "smoke": args.smoke, **asyncio.run(measure(args.max_bytes, args.trials, args.busy, args.mac))}
    result["seconds"] = round(time.perf_counter() - start, 1)
    print_table(result)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "transfer.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
