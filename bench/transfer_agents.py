"""bench/transfer.py's pull: two agents' transfer planes over busy engines, the owner in a process
of its own (owner_main), the requester in the bench's."""

import asyncio
import itertools
import sys
import time
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from radixmesh.node_agent.engine.config import EngineConfig
from radixmesh.node_agent.engine.engine import Engine
from radixmesh.node_agent.engine.request import Request, RequestId
from radixmesh.node_agent.engine.runner import EngineRunner, Finished
from radixmesh.node_agent.memory.config import MemoryConfig
from radixmesh.node_agent.memory.tiers import TierMemory
from radixmesh.node_agent.transfer.client import PullConfig
from radixmesh.node_agent.transfer.handshake import NodeIdentity
from radixmesh.node_agent.transfer.plane import TransferConfig, TransferPlane, make_transfer_plane
from radixmesh.proto.block_hash import BlockHash, hash_blocks
from radixmesh.proto.ids import BlockId, NodeId
from radixmesh.proto.serve.sampling import SamplingParams
from tests.support.tiny_model import SOURCE
from tests.support.transfer_owner import SECRET

BLOCK_BYTES = 64 << 10
SPARE_BLOCKS = 64
"""Pool blocks beyond the largest pull: room for the busy requests."""
OWNER = NodeId("bench-owner")


def hashes_for(n: int) -> list[BlockHash]:
    return hash_blocks(np.arange(n * 16), 16)


@dataclass
class BusyAgent:
    """An engine on its runner, kept decoding, with the transfer plane the agent would build on it."""

    engine: Engine
    runner: EngineRunner
    plane: TransferPlane
    busy: list[asyncio.Task[None]]
    mac_plane: TransferPlane | None = None
    """The plane of the same agent with --transfer-mac (pulls only: nothing serves from it)."""

    @property
    def tier(self) -> TierMemory:
        """The gpu tier: the transfer plane's handle on the engine's memory (NodeAgent hands it the
        same), where the bench seeds blocks and lands its pulls as the plane's callers do."""
        return self.engine.memory.gpu

    @classmethod
    async def start(cls, node: NodeId, num_blocks: int, busy: int, mac: bool = False) -> "BusyAgent":
        """`mac`: also build `mac_plane`."""
        model = await asyncio.to_thread(SOURCE.load)
        probe = EngineConfig(block_size=1, model_id=SOURCE.identity())
        per_token = Engine(model, probe).layout.block_bytes  # tiny: a throwaway engine of 1-token blocks
        memory = MemoryConfig(num_gpu_blocks=num_blocks)
        engine = Engine(model, EngineConfig(block_size=BLOCK_BYTES // per_token, model_id=SOURCE.identity(),
                                            memory=memory))
        assert engine.layout.block_bytes == BLOCK_BYTES, engine.layout.block_bytes
        runner = EngineRunner(engine)
        config = TransferConfig("ucx", NodeIdentity(SECRET, node), pull=PullConfig(timeout_s=120.0))
        tier = engine.memory.gpu  # the plane's handle on memory, as NodeAgent gives it (BusyAgent.tier)
        plane = make_transfer_plane(tier, engine.layout, config, runner.call)
        await plane.start()
        mac_plane = make_transfer_plane(tier, engine.layout,
                                        replace(config, pull=replace(config.pull, mac=True)), runner.call) if mac else None
        return cls(engine, runner, plane, [asyncio.create_task(keep_busy(runner, i)) for i in range(busy)],
                   mac_plane)

    def check(self) -> None:
        """Raise what stopped a busy request loop: a bench whose engine went idle measures nothing."""
        for t in self.busy:
            if t.done():
                t.result()
                raise RuntimeError("a busy request loop ended")

    async def stop(self) -> None:
        for t in self.busy:
            t.cancel()
        await asyncio.gather(*self.busy, return_exceptions=True)
        await self.plane.stop()
        if self.mac_plane is not None:
            await self.mac_plane.stop()
        await self.runner.close()


async def keep_busy(runner: EngineRunner, worker: int) -> None:
    """Decode requests one after the other (the same prompt each time: its blocks stay cached, so the
    busy engine never evicts the blocks a pull reads)."""
    tokens = tuple((worker * 31 + i * 7) % 250 for i in range(200))
    params = SamplingParams(max_tokens=48, ignore_eos=True)
    for i in itertools.count():
        queue = await runner.submit(Request(RequestId(f"busy-{worker}-{i}"), tokens, params))
        while not isinstance(item := await queue.get(), Finished):
            if isinstance(item, BaseException):
                raise item


def busy_state(agent: BusyAgent) -> tuple[int, int, float]:
    c = agent.engine.counters
    return c.steps, c.generated_tokens, time.perf_counter()


def busy_since(agent: BusyAgent, start: tuple[int, int, float]) -> dict[str, float]:
    """How busy the engine was since `start`: its steps and decoded tokens per second."""
    agent.check()
    steps, tokens, at = busy_state(agent)
    seconds = at - start[2]
    return {"steps_per_s": round((steps - start[0]) / seconds, 1),
            "tokens_per_s": round((tokens - start[1]) / seconds, 1), "seconds": round(seconds, 1)}


def seed(agent: BusyAgent, n: int) -> None:
    """On the engine thread: cache hashes_for(n) in n contiguous blocks of random bytes."""
    tier = agent.tier
    blocks = tier.pool.allocate(n, contiguous=True)
    tier.kv[blocks[0] : blocks[0] + n].view(-1).view(torch.uint8).random_(0, 256)
    tier.cache.insert(hashes_for(n), blocks)
    tier.cache.release(blocks)


def land(tier: TierMemory, hashes: list[BlockHash], blocks: list[BlockId], received: int) -> None:
    """On the engine thread: what arrived becomes cached (and evictable: the next pull's allocation
    reuses it), the rest goes back to the pool."""
    tier.cache.insert(hashes[:received], blocks[:received])
    tier.cache.release(blocks)
    tier.cache.take_events()  # nobody publishes them here


def owner_main(conn: Connection, n: int, busy: int) -> None:
    asyncio.run(_owner(conn, n, busy))


async def _owner(conn: Connection, n: int, busy: int) -> None:
    torch.set_num_threads(1)
    agent = await BusyAgent.start(OWNER, n + SPARE_BLOCKS, busy)
    await agent.runner.call(seed, agent, n)
    conn.send(agent.plane.address)
    loop = asyncio.get_running_loop()
    busy_from = busy_state(agent)
    await loop.run_in_executor(None, conn.recv)  # until told to stop
    conn.send(busy_since(agent, busy_from))
    await agent.stop()
