"""TransferClient's own checks, before any byte is sent: bad input, no room, bad settings."""

import asyncio

import pytest

from radixmesh.common.block_pool.block_pool import BlockPool
from radixmesh.common.prefix_cache.prefix_cache import PrefixCache
from radixmesh.node_agent.transfer.client import PullConfig, PullOutcome, TransferClient
from radixmesh.node_agent.transfer.handshake import NodeIdentity
from radixmesh.node_agent.transfer.plane import transport_by_name
from radixmesh.node_agent.transfer.transport import Peer
from radixmesh.node_agent.transfer.ucx_transport import UcxTransport
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.events import Tier
from radixmesh.proto.ids import NodeId
from tests.support.transfer_owner import LAYOUT, REQUESTER, SECRET, sequence_hashes

# Nothing listens here; a test that reached the network would fail with peer_lost.
NOWHERE = Peer(NodeId("nowhere"), "127.0.0.1", 9)


def client(num_blocks: int = 8) -> TransferClient:
    cache = PrefixCache(BlockPool(num_blocks, tier=Tier.HOST, block_bytes=LAYOUT.block_bytes))
    return TransferClient(cache, LAYOUT.new_cache(num_blocks), LAYOUT, PullConfig(),
                          UcxTransport(NodeIdentity(SECRET, REQUESTER), loopback=True))


@pytest.mark.parametrize("hashes", [[BlockHash(b"short")], sequence_hashes(2) * 2])
def test_malformed_hashes_raise_and_allocate_nothing(hashes: list[BlockHash]) -> None:
    c = client()
    with pytest.raises(ValueError, match="distinct 16-byte"):
        asyncio.run(c.pull(NOWHERE, hashes))
    assert c.cache.pool.num_free == 8
    c.cache.check_invariants()


def test_no_room_returns_no_space_without_contacting_the_peer() -> None:
    c = client()
    held = c.cache.pool.allocate(8)
    result = asyncio.run(c.pull(NOWHERE, sequence_hashes(3)))
    assert (result.outcome, result.blocks) == (PullOutcome.NO_SPACE, 0)
    assert c.stats[NodeId("nowhere")].outcomes == {"no_space": 1}
    c.cache.release(held)
    c.cache.check_invariants()


def test_unreachable_peer_is_peer_lost_and_frees_the_blocks() -> None:
    c = client()
    result = asyncio.run(c.pull(NOWHERE, sequence_hashes(3)))
    assert (result.outcome, result.blocks) == (PullOutcome.PEER_LOST, 0)
    assert c.cache.pool.num_in_use == 0
    c.cache.check_invariants()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"checksum": "md5"}, "unknown checksum"), ({"chunk_bytes": 0}, "chunk_bytes"),
     ({"chunk_bytes": (1 << 30) + 1}, "chunk_bytes"), ({"ewma_alpha": 0.0}, "ewma_alpha")],
)
def test_config_validation(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        PullConfig(**kwargs)


def test_transport_registry() -> None:
    assert transport_by_name("ucx", NodeIdentity(SECRET, REQUESTER)).name == "ucx"
    with pytest.raises(ValueError, match="valid: \\['auto', 'ray', 'ucx'\\]"):
        transport_by_name("carrier-pigeon", NodeIdentity(SECRET, REQUESTER))
