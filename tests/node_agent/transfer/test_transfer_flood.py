"""A flood of silent connections does not lock honest requesters out of an owner (server.PreAuthLimits):
one address gets a few unauthenticated connections at a time, each closed after the first-byte
timeout, so 300 silent sockets from 127.0.0.2 leave a requester on 127.0.0.1 its pull."""

import asyncio
import time
from collections.abc import Iterator

import pytest

from radixmesh.node_agent.transfer.client import PullOutcome
from radixmesh.node_agent.transfer.server import PreAuthLimits
from tests.node_agent.transfer import test_transfer_ucx
from tests.node_agent.transfer.test_transfer_ucx import Owner, Requester, assert_owner_clean
from tests.support.transfer_owner import OwnerSpec, kv_digest, sequence_hashes

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
loop = test_transfer_ucx.loop

SILENT = 300
"""More than the server's whole connection cap (OwnerSpec's 256, the default)."""
ATTACKER = "127.0.0.2"
"""Another source address of this host (all of 127.0.0.0/8 is loopback)."""


@pytest.fixture
def flooded() -> Iterator[Owner]:
    o = Owner(OwnerSpec())  # the server's defaults: 256 connections, 5 s handshake, PreAuthLimits()
    yield o
    o.stop()


def test_silent_sockets_from_one_host_leave_room_and_are_closed_soon(loop: asyncio.AbstractEventLoop,
                                                                    flooded: Owner) -> None:
    limits = PreAuthLimits()
    spec = OwnerSpec()
    assert limits.per_source < SILENT and limits.first_byte_timeout_s < spec.handshake_timeout_s

    async def flood() -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
        return [await asyncio.open_connection("127.0.0.1", flooded.port, local_addr=(ATTACKER, 0))
                for _ in range(SILENT)]

    opened = time.monotonic()
    silent = loop.run_until_complete(flood())
    req = Requester(loop)
    result = req.pull(flooded.peer(), sequence_hashes(12))  # connects after every silent socket
    assert (result.outcome, result.blocks) == (PullOutcome.OK, 12)
    assert kv_digest(req.kv, result.block_ids) == flooded.call("digest", 12)
    req.finish(result)

    async def closed_by_owner(reader: asyncio.StreamReader) -> float:
        """Seconds from the flood's start until the owner closed this socket."""
        async with asyncio.timeout(spec.handshake_timeout_s * 4):  # a deadline, not a pause
            assert await reader.read() == b""
        return time.monotonic() - opened

    async def all_closed() -> list[float]:
        return list(await asyncio.gather(*(closed_by_owner(r) for r, _ in silent)))

    closed_after = loop.run_until_complete(all_closed())
    for _, writer in silent:
        writer.close()
    # Over the per-source cap: closed on arrival; the others by the first-byte timeout, well before
    # the 5 s handshake timeout would have closed them.
    assert max(closed_after) < spec.handshake_timeout_s, max(closed_after)
    state = flooded.call("state")
    assert state["refused"] == SILENT and state["served"] == 1
    assert_owner_clean(flooded)


def test_pre_auth_limits_are_validated() -> None:
    with pytest.raises(ValueError, match="per_source <= total"):
        PreAuthLimits(first_byte_timeout_s=0)
    with pytest.raises(ValueError, match="per_source <= total"):
        PreAuthLimits(per_source=0)
    with pytest.raises(ValueError, match="per_source <= total"):
        PreAuthLimits(per_source=65, total=64)
