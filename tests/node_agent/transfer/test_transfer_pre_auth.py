"""Pre-auth slots are shared fairly (issue 38, item 15): under `up --local` every honest agent connects
from 127.0.0.1, and a flood from four other loopback addresses, 16 stalled handshakes each, used to
take all 64 slots for 5 s (1-4 of 20 honest pulls got through). Now a newcomer takes the slot of the
oldest connection of the source holding most, so every honest pull goes through. Unit tests pin the
eviction order of PreAuthSlots exactly."""

import asyncio
import struct
from collections.abc import Iterator

import pytest

from radixmesh.node_agent.transfer.client import PullOutcome, PullResult
from radixmesh.node_agent.transfer.pre_auth import PreAuthLimits, PreAuthSlots
from radixmesh.node_agent.transfer.protocol import MAX_HANDSHAKE_FRAME_BYTES, Kind
from tests.node_agent.transfer import test_transfer_ucx
from tests.node_agent.transfer.test_transfer_ucx import Owner, Requester, assert_owner_clean
from tests.support.transfer_owner import OwnerSpec, kv_digest, sequence_hashes

loop = test_transfer_ucx.loop
ATTACKERS = [f"127.0.0.{i}" for i in range(2, 6)]
"""Four more source addresses of this host: each holds PreAuthLimits().per_source, 64 in all."""
HONEST = 8


class Slots:
    """PreAuthSlots with every close recorded by name."""

    def __init__(self, per_source: int, total: int) -> None:
        self.slots = PreAuthSlots(PreAuthLimits(per_source=per_source, total=total))
        self.closed: list[str] = []

    def admit(self, source: str, name: str) -> int:
        ticket = self.slots.admit(source, lambda: self.closed.append(name))
        self.slots.check_invariants()
        return ticket


def test_a_source_at_its_cap_gives_up_its_oldest() -> None:
    s = Slots(per_source=2, total=8)
    s.admit("a", "a0")
    s.admit("a", "a1")
    s.admit("b", "b0")
    s.admit("a", "a2")
    assert s.closed == ["a0"] and s.slots.held_by("a") == 2 and s.slots.held_by("b") == 1


def test_when_all_are_taken_the_source_holding_most_gives_up_its_oldest() -> None:
    s = Slots(per_source=3, total=5)
    for name in ("x0", "x1", "x2"):
        s.admit("x", name)
    y0 = s.admit("y", "y0")
    s.admit("y", "y1")
    s.admit("honest", "h0")  # full: x holds most
    s.admit("z", "z0")  # x and y hold two each: x's oldest is older
    s.slots.release("y", y0)  # authenticated: gone without a close
    assert s.closed == ["x0", "x1"] and len(s.slots) == 4 and s.slots.evicted == 2
    s.slots.release("y", y0)  # idempotent


@pytest.fixture
def owner() -> Iterator[Owner]:
    o = Owner(OwnerSpec())
    yield o
    o.stop()


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_four_flooding_sources_leave_every_honest_pull_its_handshake(loop: asyncio.AbstractEventLoop,
                                                                    owner: Owner) -> None:
    limits = PreAuthLimits()
    assert len(ATTACKERS) * limits.per_source == limits.total

    async def stall() -> list[asyncio.StreamWriter]:
        """Each connection sends a HELLO frame's head and nothing more: it holds its slot for the whole
        handshake timeout (5 s), not just the first-byte timeout."""
        writers = []
        for source in ATTACKERS:
            for _ in range(limits.per_source):
                _, writer = await asyncio.open_connection("127.0.0.1", owner.port, local_addr=(source, 0))
                writer.write(struct.pack("<IB", MAX_HANDSHAKE_FRAME_BYTES, Kind.HELLO))
                await writer.drain()
                writers.append(writer)
        return writers

    stalled = loop.run_until_complete(stall())
    # The owner accepts in arrival order, so all 64 stalled connections hold a slot before the first
    # honest one arrives; each honest handshake then finishes within the stalled ones' 5 s.
    # A requester per handshake (one keeps its connection for every pull), all at once, as the agents
    # of a local cluster pull when a shared prefix is routed to each.
    reqs = [Requester(loop) for _ in range(HONEST)]

    async def pull_all() -> list[PullResult]:
        return list(await asyncio.gather(*(r.client.pull(owner.peer(), sequence_hashes(4)) for r in reqs)))

    results = loop.run_until_complete(pull_all())
    for req, result in zip(reqs, results, strict=True):
        assert (result.outcome, result.blocks) == (PullOutcome.OK, 4)
        assert kv_digest(req.kv, result.block_ids) == owner.call("digest", 4)
        req.finish(result)
    for writer in stalled:
        writer.close()
    state = owner.call("state")
    assert state["served"] == HONEST and state["refused"] >= 1  # stalled slots given up to honest handshakes
    assert_owner_clean(owner)
