"""Hand-off: after an owner has sent every block of a pull, those blocks are the first it evicts (the
cluster keeps one copy of a conversation that moved, not two). Unit tests drive a TransferSource in
process; the agent test pulls over UCX between two real agents on 127.0.0.1."""

from collections.abc import AsyncIterator

import pytest

from radixmesh.common.block_pool.block_pool import BlockPool
from radixmesh.common.block_pool.config import PoolConfig
from radixmesh.common.block_pool.eviction import EVICTION_ORDERS
from radixmesh.common.prefix_cache.prefix_cache import PrefixCache
from radixmesh.node_agent.agent import NodeAgent
from radixmesh.node_agent.transfer.protocol import PullRequest
from radixmesh.node_agent.transfer.pull_source import TransferSource
from radixmesh.proto.block_hash import BlockHash, tenant_salt
from radixmesh.proto.events import Tier
from radixmesh.proto.serve.plan import PullPlan
from tests.support.agents import collect, plan, prompt, ucx_pair
from tests.support.transfer_owner import LAYOUT, SESSION, sequence_hashes

SEQ = sequence_hashes(30)
"""Cached by the owner as one chain, whose tail goes first: SEQ[29], SEQ[28], ..., SEQ[0]."""
PULLED = SEQ[10:20]
"""Neither end of the chain, so that only hand-off makes these the first to go."""


def owner(eviction: str, handoff: bool) -> TransferSource:
    pool = BlockPool(32, tier=Tier.HOST, block_bytes=LAYOUT.block_bytes, config=PoolConfig(eviction=eviction))
    cache = PrefixCache(pool)
    ids = pool.allocate(len(SEQ))
    cache.insert(SEQ, ids)
    cache.release(ids)
    return TransferSource(cache, LAYOUT.new_cache(32), LAYOUT, handoff=handoff)


def serve(source: TransferSource, hashes: list[BlockHash], *, delivered: bool) -> None:
    """One pull of `hashes` as a transport runs it; `delivered`: every chunk was sent."""
    with source.open(PullRequest(1, LAYOUT.fingerprint(), tuple(hashes), 1000, LAYOUT.block_bytes, "crc32"),
                     SESSION) as pull:
        for _ in pull.chunks():
            pass
        if delivered:
            pull.delivered()


def evicted(source: TransferSource, n: int) -> set[BlockHash]:
    source.cache.pool.evict(n)
    source.check_invariants()
    return {h for h in SEQ if h not in source.cache}


@pytest.mark.parametrize("eviction", sorted(EVICTION_ORDERS))
def test_a_delivered_pull_is_evicted_before_older_blocks(eviction: str) -> None:
    source = owner(eviction, handoff=True)
    serve(source, PULLED, delivered=True)
    assert source.handed_off_blocks == len(PULLED)
    assert evicted(source, len(PULLED)) == set(PULLED)


@pytest.mark.parametrize(("handoff", "delivered"), [(False, True), (True, False)])
def test_without_hand_off_or_delivery_the_order_is_plain_lru(handoff: bool, delivered: bool) -> None:
    source = owner("lru", handoff=handoff)
    serve(source, PULLED, delivered=delivered)
    assert source.handed_off_blocks == 0
    # The pull re-used PULLED (pin, release), so they are the newest: the chain's tail goes first.
    assert evicted(source, 10) == set(SEQ[20:])


def test_blocks_in_use_here_are_not_handed_off() -> None:
    source = owner("lru", handoff=True)
    held = source.cache.match(PULLED[:4])  # a running request of the owner reads them
    serve(source, PULLED, delivered=True)
    assert source.handed_off_blocks == len(PULLED) - 4
    assert evicted(source, 6) == set(PULLED[4:])
    source.cache.release(held)


# --- two real agents, UCX on 127.0.0.1 ------------------------------------------------------------

@pytest.fixture(params=[True, False], ids=["handoff", "no-handoff"])
async def pair(request: pytest.FixtureRequest) -> AsyncIterator[tuple[NodeAgent, NodeAgent]]:
    async with ucx_pair(handoff=request.param) as agents:
        yield agents


@pytest.mark.anyio
@pytest.mark.integration
async def test_agent_owner_evicts_what_a_peer_pulled_first(pair: tuple[NodeAgent, NodeAgent]) -> None:
    owner_agent, puller = pair
    moved, stays = prompt(40, 30), prompt(41, 30)  # 7 usable blocks each; `moved` is the older
    await collect(owner_agent.serve(plan("m", moved)))
    await collect(owner_agent.serve(plan("s", stays)))
    _, got = await collect(puller.serve(plan("p", moved, pull=PullPlan(owner_agent.node,
                                                                         owner_agent.transfer_address, 0, 7))))
    assert got.stats.tokens.remote == 28 and not got.stats.pull_failed

    def hashes(tokens: tuple[int, ...]) -> list[BlockHash]:
        return owner_agent.memory.hash_prompt(tokens[:28], tenant_salt(""))

    memory = owner_agent.memory

    def evict_7() -> tuple[int, int]:
        memory.evict(Tier.GPU, 7)
        return memory.cached_prefix(Tier.GPU, hashes(moved)), memory.cached_prefix(Tier.GPU, hashes(stays))

    kept_moved, kept_stays = await owner_agent.runner.call(evict_7)
    if owner_agent.config.handoff:  # the pulled prefix goes first
        assert (kept_moved, kept_stays) == (0, 7)
    else:  # the pull renewed it: older blocks (of `stays`, or generated ones) go first
        assert kept_moved == 7
    await owner_agent.check_invariants()
