"""Faults at an exact moment inside live agent actors, with no sleeps: a hook installed in one actor's
own process (Ray's `__ray_call__`, which runs a function on the actor instance) patches a class of
that process only (each actor has a worker process of its own), and meets the test at a `Gate`.

- `hold_next_pull`: the agent's next pull stops before it starts (the hand-off's prefill has ended,
  nothing is pulled yet) until the test opens the gate.
- `stall_pulls_served`: the agent stops inside every pull it serves, once it has pinned the blocks
  (the requester waits for them), for good: the test kills it there.
"""

import asyncio
import threading
from typing import Any

import ray


@ray.remote(num_cpus=0)
class Gate:
    """Where a hook meets the test: the hook `arrive`s with what it reached; a hook that holds then
    waits for `opened` until the test calls `open`."""

    def __init__(self) -> None:
        self._arrivals: asyncio.Queue[str] = asyncio.Queue()
        self._open = asyncio.Event()

    async def arrive(self, what: str) -> None:
        self._arrivals.put_nowait(what)

    async def arrival(self) -> str:
        """The next thing a hook reached (waits for it)."""
        return await self._arrivals.get()

    async def open(self) -> None:
        self._open.set()

    async def opened(self) -> None:
        await self._open.wait()


def hold_next_pull(actor: Any, gate: Any) -> None:
    """(Run through `agent.__ray_call__`.) The agent's next pull arrives at `gate` with the peer it
    pulls from and starts once the gate is open; later pulls run as usual."""
    from radixmesh.node_agent.transfer.plane import AgentTransfer

    original = AgentTransfer.receive

    async def held(self: AgentTransfer, peer: str, *args: Any, **kwargs: Any) -> Any:
        AgentTransfer.receive = original  # type: ignore[method-assign]  # one pull only
        await gate.arrive.remote(str(peer))
        await gate.opened.remote()
        return await original(self, peer, *args, **kwargs)  # type: ignore[arg-type]

    AgentTransfer.receive = held  # type: ignore[assignment,method-assign]


def stall_pulls_served(actor: Any, gate: Any) -> None:
    """(Run through `agent.__ray_call__`.) Every pull the agent serves pins its blocks, arrives at
    `gate` with the number pinned, and then never sends: the engine thread that opened it (the pull's
    `serial`) waits for ever, for the test to kill the agent."""
    from radixmesh.node_agent.transfer.pull_source import TransferSource

    original = TransferSource.open

    def stalled(self: TransferSource, *args: Any) -> Any:
        pull = original(self, *args)
        ray.get(gate.arrive.remote(str(pull.header.found)))  # off the actor's event loop: the engine thread
        threading.Event().wait()
        return pull

    TransferSource.open = stalled  # type: ignore[assignment,method-assign]
