"""NodeAgent in-process: serving plans, streaming, stats accounting, bad input, cancellation."""

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from radixmesh.cluster.fleet.agent_client import AgentUnavailable, LocalAgentClient, StaticAgentDirectory
from radixmesh.node_agent.agent import NodeAgent
from radixmesh.node_agent.engine.request import RequestId
from radixmesh.node_agent.engine.runner import EngineRunner
from radixmesh.proto.events import Tier
from radixmesh.proto.ids import NodeId
from radixmesh.proto.serve.plan import PullPlan, ServePlan, TokenDelta
from tests.support.agents import agent_config, collect, plan, prompt, reference, ucx_pair
from tests.support.poll import until

pytestmark = pytest.mark.anyio


@pytest.fixture
async def agent() -> AsyncIterator[NodeAgent]:
    a = NodeAgent(agent_config("a"))
    await a.start()
    yield a
    await a.stop()


async def test_serve_streams_tokens_equal_to_a_cacheless_engine(agent: NodeAgent) -> None:
    tokens = prompt(1, 22)
    deltas, result = await collect(agent.serve(plan("q1", tokens)))
    assert result.output_token_ids == reference(tokens)
    assert tuple(t for d in deltas for t in d.token_ids) == result.output_token_ids
    s = result.stats
    assert (s.prompt_tokens, s.tokens.computed, s.tokens.local_gpu, s.tokens.remote) == (22, 22, 0, 0)
    assert result.node == "a" and not s.pull_failed and s.ttft_s > 0
    await agent.check_invariants()


async def test_second_request_hits_the_local_prefix_and_stats_sum(agent: NodeAgent) -> None:
    tokens = prompt(2, 21)
    _, first = await collect(agent.serve(plan("q1", tokens)))
    _, second = await collect(agent.serve(plan("q2", tokens)))
    assert second.output_token_ids == first.output_token_ids
    s = second.stats
    assert s.tokens.local_gpu == 20  # 5 full blocks; the 21st token is always computed
    assert s.tokens.local_gpu + s.tokens.local_host + s.tokens.remote + s.tokens.computed == s.prompt_tokens
    assert [h.tokens.local_gpu for h in agent.take_hits()] == [0, 20]
    assert agent.take_hits() == []


async def test_tenants_do_not_share_prefixes(agent: NodeAgent) -> None:
    tokens = prompt(3, 17)
    await collect(agent.serve(plan("q1", tokens, tenant="alice")))
    _, other = await collect(agent.serve(plan("q2", tokens, tenant="bob")))
    assert other.stats.tokens.local_gpu == 0


async def test_concurrent_requests_are_batched_and_exact(agent: NodeAgent) -> None:
    prompts = [prompt(10 + i, 9 + 5 * i) for i in range(4)]
    results = await asyncio.gather(*(collect(agent.serve(plan(f"c{i}", p))) for i, p in enumerate(prompts)))
    for p, (_, r) in zip(prompts, results, strict=True):
        assert r.output_token_ids == reference(p)
    await agent.check_invariants()


@pytest.mark.parametrize("bad", [
    plan("b1", ()),
    plan("b2", (1, 2, 300)),
    plan("b3", prompt(4, 500), max_tokens=100),
    plan("b4", prompt(4, 12), pull=PullPlan(NodeId("z"), "127.0.0.1:1", 2, 5)),
    plan("b5", prompt(4, 12), pull=PullPlan(NodeId("z"), "nowhere", 0, 1)),
    plan("b6", prompt(4, 12), pull=PullPlan(NodeId("a"), "127.0.0.1:1", 0, 1)),
    plan("b7", prompt(4, 12), pull=PullPlan(NodeId("z"), "ray:", 0, 1)),
])
async def test_bad_plans_raise_value_error_and_change_nothing(agent: NodeAgent, bad: ServePlan) -> None:
    before = logical_metrics(await agent.prometheus_text())
    with pytest.raises(ValueError):
        await collect(agent.serve(bad))
    await agent.check_invariants()
    assert agent.memory.block_counts(Tier.GPU).free == 96
    assert logical_metrics(await agent.prometheus_text()) == before


def logical_metrics(text: str) -> list[str]:
    """The exposition without the process's resident set, which moves whatever the agent does."""
    return [line for line in text.splitlines() if "radixmesh_process_resident_bytes" not in line]


async def test_duplicate_active_request_id_is_refused(agent: NodeAgent) -> None:
    stream = agent.serve(plan("dup", prompt(5, 10), max_tokens=30))
    first = await anext(stream)
    assert isinstance(first, TokenDelta)
    with pytest.raises(ValueError, match="already"):
        await collect(agent.serve(plan("dup", prompt(6, 10))))
    await stream.aclose()


async def test_consumer_leaving_mid_stream_frees_the_request(agent: NodeAgent) -> None:
    stream = agent.serve(plan("gone", prompt(7, 13), max_tokens=40))
    assert isinstance(await anext(stream), TokenDelta)
    await stream.aclose()
    await agent.check_invariants()
    assert agent.memory.block_counts(Tier.GPU).in_use == 0
    assert not agent.runner.is_active(RequestId("gone"))


async def test_planned_pull_without_transfer_plane_is_recomputed(agent: NodeAgent) -> None:
    tokens = prompt(8, 25)
    pull = PullPlan(NodeId("peer"), "127.0.0.1:9", 0, 4)
    _, result = await collect(agent.serve(plan("p", tokens, pull=pull)))
    assert result.stats.pull_failed and result.stats.tokens.computed == 25
    assert result.output_token_ids == reference(tokens)


async def test_local_client_and_directory() -> None:
    a = NodeAgent(agent_config("x"))
    await a.start()
    client = LocalAgentClient(a)
    directory = StaticAgentDirectory([client])
    assert directory.nodes() == ["x"] and directory.get(NodeId("x")) is client
    _, result = await collect(client.serve(plan("l1", prompt(9, 11))))
    assert result.node == "x"
    assert "radixmesh_agent_requests_total" in await client.prometheus_text()
    with pytest.raises(ValueError):
        await collect(client.serve(plan("l2", ())))
    await a.stop()
    with pytest.raises(AgentUnavailable):
        await collect(client.serve(plan("l3", prompt(9, 11))))
    with pytest.raises(AgentUnavailable):
        await client.prometheus_text()
    directory.remove(NodeId("x"))
    assert directory.get(NodeId("x")) is None and directory.nodes() == []


async def test_ray_transport_outside_an_agent_actor_is_refused_at_start() -> None:
    a = NodeAgent(agent_config("r", transfer="ray"))
    with pytest.raises(ValueError, match="make_agent_actor"):
        await a.start()
    with pytest.raises(RuntimeError, match="not started"):  # nothing kept running
        _ = a.runner


@pytest.mark.integration
async def test_auto_transport_picks_ucx_where_ucxx_loads() -> None:
    a = NodeAgent(agent_config("u", transfer="auto"))
    await a.start()
    try:
        host, port = a.transfer_address.rsplit(":", 1)
        assert host == "127.0.0.1" and int(port) > 0
    finally:
        await a.stop()


async def test_stopping_the_agent_mid_stream_surfaces_as_unavailable() -> None:
    a = NodeAgent(agent_config("s"))
    await a.start()
    stream = LocalAgentClient(a).serve(plan("s1", prompt(12, 10), max_tokens=200))
    assert isinstance(await anext(stream), TokenDelta)
    await a.stop()
    with pytest.raises(AgentUnavailable):
        await collect(stream)


# --- pulls over the transfer plane (UCX on 127.0.0.1, both agents in this process) ---------------

@pytest.fixture
async def pair() -> AsyncIterator[tuple[NodeAgent, NodeAgent]]:
    async with ucx_pair() as agents:
        yield agents


@pytest.mark.integration
async def test_pulled_prefix_gives_remote_hits_and_exact_tokens(pair: tuple[NodeAgent, NodeAgent]) -> None:
    owner, puller = pair
    tokens = prompt(20, 30)  # 7 full blocks; 7 usable (the 30th token is computed)
    await collect(owner.serve(plan("o", tokens)))
    pull = PullPlan(owner.node, owner.transfer_address, 0, 7)
    _, got = await collect(puller.serve(plan("p", tokens, pull=pull)))
    assert got.output_token_ids == reference(tokens)
    s = got.stats
    assert (s.tokens.remote, s.tokens.computed, s.pull_failed) == (28, 2, False)
    assert s.pull_bytes == 7 * puller.layout.block_bytes and s.pull_seconds > 0
    _, again = await collect(puller.serve(plan("p2", tokens)))
    assert again.stats.tokens.local_gpu == 28 and again.output_token_ids == got.output_token_ids
    assert "owner" in (await puller.load()).pull_gbps
    text = await puller.prometheus_text()
    assert f'radixmesh_pull_bytes_total{{model_name="{puller.config.model_name}",node="puller",peer="owner"}}' in text
    await owner.check_invariants()
    await puller.check_invariants()


@pytest.mark.integration
async def test_pull_extends_the_local_prefix(pair: tuple[NodeAgent, NodeAgent]) -> None:
    owner, puller = pair
    tokens = prompt(21, 33)
    await collect(owner.serve(plan("o", tokens)))
    await collect(puller.serve(plan("p0", tokens[:13])))  # the puller holds blocks 0-2 itself
    pull = PullPlan(owner.node, owner.transfer_address, 3, 5)
    _, got = await collect(puller.serve(plan("p", tokens, pull=pull)))
    s = got.stats
    assert (s.tokens.local_gpu, s.tokens.remote, s.tokens.computed) == (12, 20, 1)
    assert got.output_token_ids == reference(tokens)


@pytest.mark.integration
async def test_partial_pull_is_recomputed_and_flagged(pair: tuple[NodeAgent, NodeAgent]) -> None:
    owner, puller = pair
    tokens = prompt(22, 40)
    await collect(owner.serve(plan("o", tokens[:17])))  # the owner holds blocks 0-3 only
    pull = PullPlan(owner.node, owner.transfer_address, 0, 9)
    _, got = await collect(puller.serve(plan("p", tokens, pull=pull)))
    s = got.stats
    assert s.pull_failed and (s.tokens.remote, s.tokens.computed) == (16, 24)
    assert got.output_token_ids == reference(tokens)
    await puller.check_invariants()


@pytest.mark.integration
async def test_dead_peer_means_recompute_not_failure(pair: tuple[NodeAgent, NodeAgent]) -> None:
    owner, puller = pair
    tokens = prompt(23, 26)
    await collect(owner.serve(plan("o", tokens)))
    address = owner.transfer_address
    await owner.stop()
    _, got = await collect(puller.serve(plan("p", tokens, pull=PullPlan(owner.node, address, 0, 6))))
    s = got.stats
    assert s.pull_failed and (s.tokens.remote, s.tokens.computed) == (0, 26)
    assert got.output_token_ids == reference(tokens)
    await puller.check_invariants()
    assert puller.memory.block_counts(Tier.GPU).in_use == 0


@pytest.mark.integration
async def test_a_peer_on_another_transport_means_recompute(pair: tuple[NodeAgent, NodeAgent]) -> None:
    owner, puller = pair
    tokens = prompt(24, 26)
    await collect(owner.serve(plan("o", tokens)))
    pull = PullPlan(owner.node, "ray:radixmesh-agent-owner", 0, 6)  # the ucx puller cannot reach an actor
    _, got = await collect(puller.serve(plan("p", tokens, pull=pull)))
    s = got.stats
    assert s.pull_failed and (s.tokens.remote, s.tokens.computed) == (0, 26)
    assert got.output_token_ids == reference(tokens)
    assert puller.memory.block_counts(Tier.GPU).in_use == 0


@contextlib.asynccontextmanager
async def engine_held(agent: NodeAgent) -> AsyncIterator[None]:
    """Hold `agent`'s engine thread with a job until the block ends: a pull from it waits for the
    owner's pin (an engine job) meanwhile, so it is in progress for as long as the test needs."""
    gate = threading.Event()
    held = asyncio.ensure_future(agent.runner.call(gate.wait))
    try:
        yield
    finally:
        gate.set()
        await held


async def on_engine(agent: NodeAgent, read: Callable[[], Any]) -> Any:
    return await agent.runner.call(read)


@pytest.mark.integration
async def test_a_pulled_request_is_queued_at_once_and_others_decode_while_it_pulls(
        pair: tuple[NodeAgent, NodeAgent]) -> None:
    owner, puller = pair
    tokens = prompt(25, 30)
    await collect(owner.serve(plan("o", tokens)))
    decoding = puller.serve(plan("d", prompt(26, 6), max_tokens=200))
    assert isinstance(await anext(decoding), TokenDelta)
    pull = PullPlan(owner.node, owner.transfer_address, 0, 7)
    async with engine_held(owner):
        pulled = asyncio.ensure_future(collect(puller.serve(plan("p", tokens, pull=pull))))
        rid = RequestId("p")
        await until(lambda: on_engine(puller, lambda: puller.engine.sequence(rid) is not None), "p queued")
        generated = puller.engine.counters.generated_tokens
        await until(lambda: puller.engine.counters.generated_tokens >= generated + 5, "d decoding")
        seq = await on_engine(puller, lambda: puller.engine.sequence(rid))
        assert seq.pulling is not None and seq.stats.sources is None and not pulled.done()
    _, got = await pulled
    assert got.output_token_ids == reference(tokens)
    assert (got.stats.tokens.remote, got.stats.tokens.computed, got.stats.pull_failed) == (28, 2, False)
    await decoding.aclose()
    await puller.check_invariants()
    assert puller.memory.block_counts(Tier.GPU).in_use == 0


@pytest.mark.integration
async def test_a_request_cancelled_mid_pull_leaks_no_block(pair: tuple[NodeAgent, NodeAgent]) -> None:
    owner, puller = pair
    tokens = prompt(27, 30)
    await collect(owner.serve(plan("o", tokens)))
    pull = PullPlan(owner.node, owner.transfer_address, 0, 7)
    async with engine_held(owner):
        serving = asyncio.ensure_future(collect(puller.serve(plan("p", tokens, pull=pull))))
        await until(lambda: on_engine(puller, lambda: puller.memory.pulling_blocks == 7), "the pull's blocks")
        serving.cancel()  # the consumer goes away mid-pull
        await asyncio.gather(serving, return_exceptions=True)
        await until(lambda: on_engine(puller, lambda: puller.memory.pulling_blocks == 0), "the pull landed")
        await puller.check_invariants()
        assert puller.memory.block_counts(Tier.GPU).in_use == 0
        assert not puller.runner.is_active(RequestId("p"))
    await until(lambda: on_engine(owner, lambda: owner.memory.block_counts(Tier.GPU).in_use == 0),
                "the owner unpinned")
    await owner.check_invariants()


@pytest.mark.integration
async def test_a_request_cancelled_while_being_queued_leaks_no_pull_block(pair: tuple[NodeAgent, NodeAgent]) -> None:
    owner, puller = pair
    tokens = prompt(29, 30)
    await collect(owner.serve(plan("o", tokens)))
    pull = PullPlan(owner.node, owner.transfer_address, 0, 7)
    async with engine_held(puller):  # the submit job (which allocates the pull's blocks) waits
        serving = asyncio.ensure_future(collect(puller.serve(plan("p", tokens, pull=pull))))
        await until(lambda: puller.runner.is_active(RequestId("p")), "p being queued", pause_s=0)
        serving.cancel()
    await asyncio.gather(serving, return_exceptions=True)
    await until(lambda: on_engine(puller, lambda: not puller.engine.has_work), "p aborted")
    await puller.check_invariants()
    assert puller.memory.block_counts(Tier.GPU).in_use == 0


@pytest.mark.integration
async def test_a_pull_costs_the_puller_two_engine_jobs_and_the_owner_one_pin_and_one_unpin(
        monkeypatch: pytest.MonkeyPatch) -> None:
    jobs: list[tuple[EngineRunner, str]] = []
    call, call_short = EngineRunner.call, EngineRunner.call_short

    async def counted(self: EngineRunner, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        jobs.append((self, fn.__name__))
        return await call(self, fn, *args, **kwargs)

    async def counted_short(self: EngineRunner, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        jobs.append((self, f"short {fn.__name__}"))
        return await call_short(self, fn, *args, **kwargs)

    # Before the agents start: their planes bind them.
    monkeypatch.setattr(EngineRunner, "call", counted)
    monkeypatch.setattr(EngineRunner, "call_short", counted_short)

    def of(agent: NodeAgent) -> list[str]:
        return [name for runner, name in jobs if runner is agent.runner and name != "_step"]

    async with ucx_pair() as (owner, puller):
        tokens = prompt(28, 30)
        await collect(owner.serve(plan("o", tokens)))
        jobs.clear()
        _, got = await collect(puller.serve(plan("p", tokens, pull=PullPlan(owner.node, owner.transfer_address, 0, 7))))
        assert got.stats.tokens.remote == 28
        await until(lambda: "short close" in of(owner), "the owner's unpin")
        # The owner's pin and unpin are short jobs: they run beside its forward, not after its step.
        assert of(owner) == ["short open", "short close"]
        assert of(puller) == ["_submit", "land_pull", "_drain_events"]  # the last: standalone, not the pull's
