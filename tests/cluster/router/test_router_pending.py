"""The router's pending holds (issue 35): a request's blocks count as held by its node while it waits
there, however long past `pending_ttl_s`, and no longer once its attempt failed."""

import asyncio
import random
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager

import pytest

from radixmesh.cluster.fleet.agent_client import AgentUnavailable, StaticAgentDirectory
from radixmesh.cluster.router.results import RouterResult
from radixmesh.cluster.router.router import Router
from radixmesh.common.metadata.auth import CallerCredentials
from radixmesh.common.metadata.client import MetadataClient
from radixmesh.proto.ids import NodeId
from radixmesh.proto.serve.plan import ServeItem, ServePlan, ServeResult, ServeStats, TokenDelta
from radixmesh.proto.serve.sampling import FinishReason, SamplingParams
from radixmesh.proto.serve.tokens import TokenSources
from tests.support.agents import prompt
from tests.support.poll import until
from tests.support.router_cluster import BS, SECRET, ManualClock, router_config, start_metadata

pytestmark = pytest.mark.anyio

X, Y = NodeId("x"), NodeId("y")


class QueuedAgent:
    """An AgentClient whose requests wait in its queue until `gate` opens; then each answers one
    token, or (`fail`) the agent is unavailable."""

    def __init__(self, node: NodeId, fail: bool = False) -> None:
        self.node = node
        self.fail = fail
        self.gate = asyncio.Event()
        self.plans: list[ServePlan] = []

    async def serve(self, plan: ServePlan) -> AsyncGenerator[ServeItem, None]:
        self.plans.append(plan)
        await self.gate.wait()
        if self.fail:
            raise AgentUnavailable(f"{self.node} is gone")
        yield TokenDelta(plan.request_id, (1,), ())
        tokens = TokenSources.of_prompt(len(plan.prompt_token_ids))
        yield ServeResult(plan.request_id, self.node, (1,), FinishReason.LENGTH,
                          ServeStats(tokens, pull_bytes=0, pull_seconds=0.0, pull_failed=False, ttft_s=0.0,
                                     decode_s=0.0, preemptions=0))

    async def prometheus_text(self) -> str:
        return ""

    async def scrape_target(self) -> None:
        return None


@asynccontextmanager
async def routing(*agents: QueuedAgent) -> AsyncIterator[tuple[Router, ManualClock]]:
    """A `cost` router over `agents`, asking a real metadata service (whose index stays empty) Match."""
    server, port = await start_metadata()
    client = MetadataClient(f"127.0.0.1:{port}", credentials=CallerCredentials.cluster(SECRET), timeout_s=10.0)
    clock = ManualClock()
    router = Router(router_config("layout", index_replica=False, match_timeout_s=10.0),
                    StaticAgentDirectory(agents), client, clock=clock, rng=random.Random(0))
    try:
        yield router, clock
        router.check_invariants()
    finally:
        await router.close()
        await client.close()
        await server.stop(0)


def request(rid: str, tokens: tuple[int, ...]) -> ServePlan:
    return ServePlan(rid, tokens, SamplingParams(max_tokens=1, ignore_eos=True))


async def test_a_turn_sent_while_its_previous_turn_waits_past_the_ttl_joins_it() -> None:
    agents = {X: QueuedAgent(X), Y: QueuedAgent(Y)}
    async with routing(*agents.values()) as (router, clock):
        turn1 = prompt(3, 8 * BS)
        first = asyncio.create_task(router.complete(request("t1", turn1)))
        await until(lambda: any(a.plans for a in agents.values()), "turn 1 to reach its node")
        queued_at = next(n for n, a in agents.items() if a.plans)
        clock.now += 3 * router.config.pending_ttl_s  # turn 1 still waits, nothing indexed
        second = asyncio.create_task(router.complete(request("t2", turn1 + prompt(4, 4 * BS))))
        await until(lambda: sum(len(a.plans) for a in agents.values()) == 2, "turn 2 to reach a node")
        for a in agents.values():
            a.gate.set()
        done = await asyncio.gather(first, second)
        assert [d.result.node for d in done] == [queued_at, queued_at]
        assert done[1].routed.decision.local_blocks == 8


async def test_a_failed_attempt_leaves_no_pending_holder_behind() -> None:
    agents = {X: QueuedAgent(X, fail=True), Y: QueuedAgent(Y)}
    for a in agents.values():
        a.gate.set()
    async with routing(*agents.values()) as (router, _):
        turn1 = prompt(5, 8 * BS)
        items = [item async for item in router.generate(request("t1", turn1), node=X)]  # x fails it, y serves it
        served = items[-1]
        assert isinstance(served, RouterResult) and served.result.node == Y and served.attempts == 2
        router.suspects.seen_alive(X)  # else x, whose attempt failed, would not be scored at all
        routed = await router.plan(request("t2", turn1 + prompt(6, 2 * BS)))
        local = {v.node: v.local_blocks for v in routed.view.nodes}
        assert local == {X: 0, Y: 8}
