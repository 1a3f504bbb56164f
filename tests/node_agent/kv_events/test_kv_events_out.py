"""An agent's cache events in vLLM's ZMQ format (node_agent/kv_events; the wire itself is tested against
vLLM's golden frames in tests/proto/test_vllm_kv_events.py), followed by radixmesh's own vLLM ingest
into the very blocks the agent holds, replayed."""

import contextlib
from collections.abc import AsyncIterator

import pytest
import zmq
import zmq.asyncio
from hypothesis import given, settings
from hypothesis import strategies as st

from radixmesh.cluster.fleet.ingest.block_map import EngineBlockMap
from radixmesh.cluster.fleet.ingest.subscriber import KVEventSubscriber, SubscriberConfig
from radixmesh.common.kv_events_curve import connect_curve
from radixmesh.node_agent.agent import NodeAgent
from radixmesh.node_agent.config import AgentConfig
from radixmesh.node_agent.engine.config import EngineConfig
from radixmesh.node_agent.kv_events.publisher import ZmqKVEventPublisher
from radixmesh.node_agent.kv_events.token_book import TokenBook
from radixmesh.node_agent.memory.config import MemoryConfig
from radixmesh.proto.block_hash import BlockHash, hash_blocks, tenant_salt
from radixmesh.proto.events import BlockStored, Tier
from radixmesh.proto.ids import NodeId
from radixmesh.proto.vllm_kv_events import (
    FULL_ATTENTION,
    REPLAY_END,
    VllmBlockRemoved,
    VllmBlockStored,
    VllmEventBatch,
    decode_batch,
    decode_seq,
    replay_request,
    wire_hash,
)
from tests.support.agents import SECRET, collect, plan, prompt
from tests.support.poll import until
from tests.support.tiny_model import BS, SOURCE

pytestmark = pytest.mark.anyio

KEY = b"cluster-hash-key"


# --- an endpoint in use (the rest of where the publisher listens: test_kv_events_endpoint.py) -----


async def test_an_endpoint_in_use_fails_the_agents_start_with_its_address() -> None:
    taken: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.PUB)
    try:
        taken.bind("tcp://127.0.0.1:0")
        address = taken.getsockopt_string(zmq.LAST_ENDPOINT)
        agent = NodeAgent(config(address))
        with pytest.raises(ValueError, match=f"cannot bind the KV events PUB socket to '{address}'"):
            await agent.start()
        assert agent.publisher is None and agent._runner is None  # what had started was stopped again
    finally:
        taken.close(linger=0)


# --- a real agent, followed by radixmesh's own ingest ---------------------------------------------
def config(endpoint: str = "tcp://127.0.0.1:0", *, gpu_blocks: int = 96, host_blocks: int = 0,
           token_ids: bool = True) -> AgentConfig:
    """Token ids on: radixmesh's ingest rebuilds our digests from them (off by default: test_kv_events_token_ids)."""
    memory = MemoryConfig(num_gpu_blocks=gpu_blocks, num_host_blocks=host_blocks, hash_key=KEY)
    return AgentConfig(NodeId("zmq"), model=SOURCE, engine=EngineConfig(block_size=BS, memory=memory),
                       transfer="none", secret=SECRET, kv_events_endpoint=endpoint, kv_events_token_ids=token_ids)


class Ingest:
    """radixmesh's vLLM ingest (subscriber + block map, as an external engine node runs them) and a
    raw SUB socket that keeps every frame."""

    def __init__(self, publisher: ZmqKVEventPublisher, ctx: zmq.asyncio.Context) -> None:
        self.map = EngineBlockMap(BS, hash_key=KEY)
        # An agent's tcp sockets admit only CURVE clients with its cluster secret's key.
        self.subscriber = KVEventSubscriber(
            SubscriberConfig(publisher.endpoint, publisher.replay_endpoint, replay_timeout_s=5.0, curve=SECRET),
            self._apply, self._forget, context=ctx)
        self.raw = ctx.socket(zmq.SUB)
        self.raw.setsockopt(zmq.SUBSCRIBE, b"")
        connect_curve(self.raw, SECRET)
        self.raw.connect(publisher.endpoint)

    def _apply(self, batch: VllmEventBatch) -> None:
        self.map.apply(batch.events)

    def _forget(self) -> None:
        self.map.forget_holdings()

    def held(self) -> set[tuple[BlockHash, Tier]]:
        return {(x, c.tier) for c in self.map.chains() for x in c.hashes}

    async def frames(self) -> list[list[bytes]]:
        """The frames the raw socket has received so far."""
        out = []
        while await self.raw.poll(0):
            out.append(await self.raw.recv_multipart())
        return out

    async def close(self) -> None:
        await self.subscriber.stop()
        self.raw.close(linger=0)


@contextlib.asynccontextmanager
async def publishing_agent(gpu_blocks: int = 96, host_blocks: int = 0, token_ids: bool = True
                           ) -> AsyncIterator[tuple[NodeAgent, ZmqKVEventPublisher]]:
    agent = NodeAgent(config(gpu_blocks=gpu_blocks, host_blocks=host_blocks, token_ids=token_ids))
    await agent.start()
    try:
        assert isinstance(agent.kv_events, ZmqKVEventPublisher)
        yield agent, agent.kv_events
    finally:
        await agent.stop()


@contextlib.asynccontextmanager
async def ingesting(publisher: ZmqKVEventPublisher) -> AsyncIterator[Ingest]:
    ctx = zmq.asyncio.Context()
    ingest = Ingest(publisher, ctx)
    before = publisher.subscriptions
    await ingest.subscriber.start()
    try:
        await until(lambda: publisher.subscriptions >= before + 2, "both subscriptions")
        yield ingest
    finally:
        await ingest.close()
        ctx.term()


async def holdings(agent: NodeAgent) -> set[tuple[BlockHash, Tier]]:
    """What the agent's tiers cache now (its snapshot drains, and so publishes, pending events)."""
    return {(x, c.tier) for c in await agent.snapshot() for x in c.hashes}


async def test_the_ingest_rebuilds_exactly_the_blocks_the_agent_holds_on_both_tiers() -> None:
    # 12 gpu blocks: later prompts evict earlier ones, which are demoted to the 64-block host tier.
    async with publishing_agent(gpu_blocks=12, host_blocks=64) as (agent, publisher), ingesting(publisher) as ingest:
        for i in range(4):
            await collect(agent.serve(plan(f"q{i}", prompt(i, 18), max_tokens=7, tenant="acme" if i == 1 else "")))
        expected = await holdings(agent)
        await until(lambda: ingest.held() == expected, "the ingest's blocks to equal the agent's")
        assert {t for _, t in expected} == {Tier.GPU, Tier.HOST}
        # Each block's int hash names our digest: the ingest's translation of it is that digest.
        for digest, _ in expected:
            assert ingest.map.our_hashes(wire_hash(digest)) == (digest,)
        assert ingest.subscriber.stats.forgets == 0 and publisher.left_out_blocks == 0
        assert ingest.map.skipped == {}
        await agent.check_invariants()
        publisher.book.check_invariants()


async def test_events_drained_mid_request_go_out_with_their_generated_tokens() -> None:
    # The metadata publisher drains every 50 ms, so blocks of generated tokens may be drained before
    # their tokens reach serve(); a snapshot after every streamed step drains the same way.
    async with publishing_agent() as (agent, publisher), ingesting(publisher) as ingest:
        async for _ in agent.serve(plan("long", prompt(1, 6), max_tokens=40)):
            await holdings(agent)
        expected = await holdings(agent)
        await until(lambda: ingest.held() == expected, "the ingest's blocks to equal the agent's")
        assert len(expected) == (6 + 40 - 1) // BS and publisher.left_out_blocks == 0


async def test_the_published_frames_decode_as_vllm_batches() -> None:
    async with publishing_agent(gpu_blocks=12, host_blocks=64) as (agent, publisher), ingesting(publisher) as ingest:
        tokens = prompt(5, 18)
        await collect(agent.serve(plan("salted", tokens, max_tokens=7, tenant="acme")))
        for i in range(3):
            await collect(agent.serve(plan(f"q{i}", prompt(i, 18), max_tokens=7)))
        await holdings(agent)
        await until(lambda: ingest.subscriber.last_seq == publisher.published - 1, "every batch")
        seen = publisher.published
        frames = await ingest.frames()
    assert [f[0] for f in frames] == [b""] * len(frames)  # vLLM's default topic
    # Every batch in order; a late one (a host-tier write landing) may follow those waited for.
    assert [decode_seq(f[1]) for f in frames] == list(range(len(frames))) and len(frames) >= seen
    batches = [decode_batch(f[2]) for f in frames]
    assert all(isinstance(b, VllmEventBatch) and b.data_parallel_rank == 0 for b in batches)
    events = [e for b in batches for e in b.events]
    stored = [e for e in events if isinstance(e, VllmBlockStored)]
    assert {e.medium for e in stored} == {"GPU", "CPU"}
    assert any(isinstance(e, VllmBlockRemoved) and e.medium == "GPU" for e in events)
    for e in stored:
        assert all(isinstance(x, int) and 0 <= x < 2**64 for x in e.block_hashes)
        assert (e.block_size, e.lora_id, e.lora_name, e.group_idx) == (BS, None, None, 0)
        assert len(e.token_ids) == len(e.block_hashes) * BS
    # The salted request's first block carries its cache salt, and only it; the int hashes are our
    # digests of its tokens under tenant_salt("acme").
    ours = hash_blocks(tokens, BS, salt=tenant_salt("acme"), key=KEY)
    first = next(e for e in stored if e.block_hashes[0] == wire_hash(ours[0]))
    assert first.parent_block_hash is None and first.token_ids[:BS] == tokens[:BS]
    assert first.extra_keys == (("acme",), *(None,) * (len(first.block_hashes) - 1))
    assert first.block_hashes == tuple(wire_hash(x) for x in ours[: len(first.block_hashes)])


async def test_a_late_subscriber_replays_the_batches_it_missed() -> None:
    async with publishing_agent() as (agent, publisher):
        await collect(agent.serve(plan("before", prompt(1, 18))))
        await holdings(agent)
        await until(lambda: publisher.published > 0, "the first batches")
        missed = publisher.published
        async with ingesting(publisher) as ingest:
            await collect(agent.serve(plan("after", prompt(2, 18))))
            expected = await holdings(agent)
            await until(lambda: ingest.held() == expected, "the ingest's blocks to equal the agent's")
            assert ingest.subscriber.stats.replayed_batches >= missed
            assert ingest.subscriber.stats.forgets == 0


# --- the publisher alone: its ring, and blocks whose tokens lag their events ---------------------
@contextlib.asynccontextmanager
async def started(book: TokenBook, buffer_steps: int = 100) -> AsyncIterator[ZmqKVEventPublisher]:
    publisher = ZmqKVEventPublisher("tcp://127.0.0.1:0", book, buffer_steps=buffer_steps, token_ids=True)
    await publisher.start()
    try:
        yield publisher
    finally:
        await publisher.stop()


async def replay(publisher: ZmqKVEventPublisher, start: int) -> list[list[bytes]]:
    """What the replay socket answers a DEALER asking from `start`, its end marker included."""
    ctx = zmq.asyncio.Context()
    dealer = ctx.socket(zmq.DEALER)
    try:
        dealer.connect(publisher.replay_endpoint)
        await dealer.send_multipart(replay_request(start))
        replies: list[list[bytes]] = []
        while not replies or replies[-1] != list(REPLAY_END):
            replies.append(await dealer.recv_multipart())
        return replies
    finally:
        dealer.close(linger=0)
        ctx.term()


def stored(reply: list[bytes]) -> VllmBlockStored:
    (event,) = decode_batch(reply[2]).events
    assert isinstance(event, VllmBlockStored)
    return event


async def test_replay_answers_from_the_asked_seq_out_of_a_bounded_ring() -> None:
    book = TokenBook(BS)
    async with started(book, buffer_steps=2) as publisher:
        for i in range(3):
            tokens = prompt(i, 2 * BS)
            hashes = hash_blocks(tokens, BS)
            book.close(book.open(tokens, hashes, None))
            publisher.offer([BlockStored(tuple(hashes), None, Tier.GPU)])
        await until(lambda: publisher.published == 3, "three batches")
        replies = await replay(publisher, 0)
    # Batch 0 left the 2-batch ring; what is kept comes as vLLM's replay sends it.
    assert [decode_seq(r[1]) for r in replies] == [1, 2, -1]
    assert [r[0] for r in replies] == [b""] * 3 and replies[-1][2] == b""
    assert [stored(r).block_hashes for r in replies[:2]] == [
        tuple(wire_hash(x) for x in hash_blocks(prompt(i, 2 * BS), BS)) for i in (1, 2)]


async def test_a_block_stored_before_its_tokens_streamed_waits_for_them() -> None:
    book = TokenBook(BS, KEY)
    async with started(book) as publisher:
        tokens = prompt(7, 2 * BS + 1)
        hashes = hash_blocks(tokens, BS, key=KEY)
        ticket = publisher.open(tokens, hashes, None)
        generated = [11, 12, 13]  # completes block 2
        block2 = hash_blocks([*tokens, *generated], BS, key=KEY)[2]
        publisher.offer([BlockStored((block2,), hashes[1], Tier.GPU)])
        await until(lambda: publisher.waiting == 1, "the batch offered")
        assert publisher.published == 0  # its tokens have not streamed yet
        publisher.extend(ticket, generated)
        await until(lambda: publisher.published == 1, "the batch published")
        (reply, _) = await replay(publisher, 0)
    assert stored(reply).token_ids == (tokens[-1], *generated)
    assert stored(reply).parent_block_hash == wire_hash(hashes[1])


async def test_blocks_whose_tokens_never_came_are_left_out_once_their_requests_end() -> None:
    book = TokenBook(BS)
    async with started(book) as publisher:
        tokens = prompt(3, 2 * BS)
        hashes = hash_blocks(tokens, BS)
        ticket = publisher.open(tokens, hashes, None)
        unseen = hash_blocks(prompt(4, 3 * BS), BS)[2]
        publisher.offer([BlockStored((hashes[0], unseen, hashes[1]), None, Tier.GPU)])
        await until(lambda: publisher.waiting == 1, "the batch offered")
        publisher.close(ticket)  # an aborted request: no more tokens will come
        await until(lambda: publisher.published == 1, "the batch published")
        (reply, _) = await replay(publisher, 0)
    events = decode_batch(reply[2]).events
    assert events == (
        VllmBlockStored((wire_hash(hashes[0]),), None, tokens[:BS], BS, None, "GPU", None, None, 0,
                        FULL_ATTENTION),
        VllmBlockStored((wire_hash(hashes[1]),), wire_hash(hashes[0]), tokens[BS:], BS, None, "GPU", None, None, 0,
                        FULL_ATTENTION),
    )
    assert publisher.left_out_blocks == 1


async def test_a_run_stored_without_its_parent_gets_the_chains_parent() -> None:
    # The host tier stores swapped-out blocks with parent None (tiers.py, swap_out): the book knows it.
    book = TokenBook(BS)
    async with started(book) as publisher:
        tokens = prompt(9, 3 * BS)
        hashes = hash_blocks(tokens, BS)
        book.close(book.open(tokens, hashes, "acme"))
        publisher.offer([BlockStored(tuple(hashes[1:]), None, Tier.HOST)])
        await until(lambda: publisher.published == 1, "the batch published")
        (reply, _) = await replay(publisher, 0)
    event = stored(reply)
    assert (event.parent_block_hash, event.medium, event.extra_keys) == (wire_hash(hashes[0]), "CPU", None)
    assert event.token_ids == tokens[BS:]


# --- the token book against an oracle --------------------------------------------------------------
OPS = st.lists(st.tuples(st.sampled_from(["serve", "hold", "release", "clear"]), st.integers(0, 5),
                         st.integers(0, 3 * BS), st.sampled_from(list(Tier))), max_size=30)


@settings(max_examples=60, deadline=None)
@given(OPS)
def test_the_book_knows_every_held_block_and_bounds_the_rest(ops: list[tuple[str, int, int, Tier]]) -> None:
    book = TokenBook(BS, KEY, max_unheld=4)
    chains: dict[BlockHash, tuple[tuple[int, ...], BlockHash | None]] = {}
    """Oracle: every block ever served, with its tokens and parent."""
    held: dict[BlockHash, set[Tier]] = {}
    for op, seed, n, tier in ops:
        tokens = prompt(seed, 2 * BS + 1)
        hashes = hash_blocks(tokens, BS, key=KEY)
        if op == "serve":  # a prompt, then `n` generated tokens
            generated = [(seed + i) % 250 for i in range(n)]
            ticket = book.open(tokens, hashes, None)
            book.extend(ticket, generated)
            book.close(ticket)
            full = [*tokens, *generated]
            chain = hash_blocks(full, BS, key=KEY)
            for i, x in enumerate(chain):
                chains[x] = (tuple(full[i * BS:(i + 1) * BS]), chain[i - 1] if i else None)
        elif op == "hold":
            known = [x for x in hashes if book.get(x) is not None]
            book.hold(hashes, tier)
            for x in known:
                held.setdefault(x, set()).add(tier)
        elif op == "release":
            book.release(hashes, tier)
            for x in hashes:
                held.get(x, set()).discard(tier)
        else:
            book.release_all()
            held.clear()
        book.check_invariants()
        for x, tiers in held.items():
            if tiers:  # a held block is never forgotten, and is what was served
                entry = book.get(x)
                assert entry is not None and (entry.tokens, entry.parent) == chains[x]
        assert len(book) <= sum(1 for t in held.values() if t) + 4


async def test_subscriptions_and_replays_are_bounded() -> None:
    """Issue 38 item 5: every subscription was stored (20 MiB of them: +1.2 GiB), a replay request of
    any size was read whole, and one 8-byte request sent back the whole ring."""
    book = TokenBook(BS)
    publisher = ZmqKVEventPublisher("tcp://127.0.0.1:0", book, topic="kv", buffer_steps=100, max_replay_bytes=1)
    await publisher.start()
    ctx = zmq.asyncio.Context()
    subs = [ctx.socket(zmq.SUB) for _ in range(3)]
    try:
        for sub, prefix in zip(subs, (b"zz-not-our-topic", b"k", b"kv"), strict=True):
            sub.setsockopt(zmq.SUBSCRIBE, prefix)
            sub.connect(publisher.endpoint)
        await until(lambda: publisher.subscriptions + publisher.refused_subscriptions == 3, "three subscriptions")
        assert (publisher.subscriptions, publisher.refused_subscriptions) == (2, 1)
        for i in range(3):
            tokens = prompt(i, 2 * BS)
            hashes = hash_blocks(tokens, BS)
            book.close(book.open(tokens, hashes, None))
            publisher.offer([BlockStored(tuple(hashes), None, Tier.GPU)])
        await until(lambda: publisher.published == 3, "three batches")
        # One batch per answer past max_replay_bytes; the consumer asks again from the next seq.
        assert [decode_seq(r[1]) for r in await replay(publisher, 0)] == [0, -1]
        assert [decode_seq(r[1]) for r in await replay(publisher, 1)] == [1, -1]
    finally:
        for sub in subs:
            sub.close(linger=0)
        ctx.term()
        await publisher.stop()
