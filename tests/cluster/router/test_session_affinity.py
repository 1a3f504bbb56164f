"""Session affinity: a session header (Ray's x-session-id, Dynamo's x-dynamo-session-id, SGLang's
x-smg-routing-key) keeps a session's requests on one node while that node stays within the load
bound; past it the policy decides and the session moves (issue 30)."""

import aiohttp
import pytest

from radixmesh.cluster.api.app import start_http
from radixmesh.cluster.policy.base import PolicyConfig
from radixmesh.cluster.router.results import RouterResult
from radixmesh.cluster.router.session_affinity import SessionAffinity, SessionConfig
from radixmesh.proto.ids import NodeId
from radixmesh.proto.serve.plan import ServePlan
from radixmesh.proto.serve.sampling import SamplingParams
from tests.support.router_cluster import MODEL_NAME, Cluster, ManualClock, local_cluster

pytestmark = pytest.mark.anyio

A, B = NodeId("a"), NodeId("b")


def _plan(i: int) -> ServePlan:
    """Prompts that share no block: the policy has no prefix to follow."""
    return ServePlan(f"r{i}", tuple(range(10 * i + 3, 10 * i + 23)), SamplingParams(max_tokens=1))


async def _nodes(cluster: Cluster, session: str | None, n: int) -> list[str]:
    """Where n requests of `session` (None: none) were served."""
    out: list[str] = []
    for i in range(n):
        async for item in cluster.router.generate(_plan(i), session=session):
            if isinstance(item, RouterResult):
                out.append(item.result.node)
    return out


async def test_round_robin_spreads_requests_without_a_session() -> None:
    async with local_cluster(2, policy="round_robin") as cluster:
        assert await _nodes(cluster, None, 4) == ["a", "b", "a", "b"]


async def test_a_session_stays_on_its_node_while_under_the_load_bound() -> None:
    async with local_cluster(2, policy="round_robin") as cluster:
        assert await _nodes(cluster, "chat-1", 4) == ["a"] * 4
        assert cluster.router.session_node("chat-1") == A
        # a second session is routed by the policy (round robin's next node), then stays there
        assert await _nodes(cluster, "chat-2", 3) == ["b"] * 3
        cluster.router.check_invariants()


async def test_a_session_moves_once_its_node_is_past_the_load_bound() -> None:
    strict = PolicyConfig(load_eps=0.0, load_floor_s=0.0)  # any imbalance is past the bound
    async with local_cluster(2, policy="round_robin", policy_config=strict) as cluster:
        # a; then a is over the mean: the policy's b; then both are (equal work), and the bound lets
        # the least loaded take it, b among them: it stays; then b is over, a is not: back to a
        assert await _nodes(cluster, "chat-1", 4) == ["a", "b", "b", "a"]
        assert cluster.router.session_node("chat-1") == A


async def test_the_session_headers_reach_the_router() -> None:
    async with local_cluster(2, policy="round_robin") as cluster:
        runner, port = await start_http(cluster.router, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{port}/v1/completions"
        try:
            async with aiohttp.ClientSession() as http:
                for header in ("x-session-id", "X-Dynamo-Session-Id", "x-smg-routing-key"):
                    for i in range(3):
                        body = {"model": MODEL_NAME, "prompt": f"turn {i} of a chat under {header}", "max_tokens": 1}
                        async with http.post(url, json=body, headers={header: f"s-{header}"}) as r:
                            assert r.status == 200
                    assert cluster.router.session_node(f"s-{header}") is not None
                served = [a.counters.requests for a in cluster.agents]
                # each session stayed on one node: 3 requests per session, never split 1-2 or 2-1
                assert sorted(served) in ([3, 6], [0, 9])
                async with http.post(url, json={"model": MODEL_NAME, "prompt": "x"},
                                     headers={"x-session-id": "s" * 257}) as r:
                    assert r.status == 400 and (await r.json())["error"]["param"] == "X-Session-Id"
        finally:
            await runner.cleanup()


def test_the_session_map_is_bounded_and_forgets_idle_sessions() -> None:
    clock = ManualClock()
    sessions = SessionAffinity(SessionConfig(max_sessions=2, ttl_s=10.0), clock)
    sessions.remember("s1", A)
    clock.now += 1
    sessions.remember("s2", B)
    clock.now += 1
    assert sessions.node("s1") == A
    sessions.remember("s1", B)  # s1 used again: s2 is now the least recently routed
    sessions.remember("s3", A)
    assert (sessions.node("s1"), sessions.node("s2"), sessions.node("s3"), len(sessions)) == (B, None, A, 2)
    sessions.check_invariants()
    clock.now += 10  # s1 and s3 were last routed 10 s ago
    assert sessions.node("s1") is None and len(sessions) == 0


@pytest.mark.parametrize("bad", [{"max_sessions": 0}, {"ttl_s": 0.0}, {"ttl_s": float("inf")}])
def test_session_config_is_validated(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        SessionConfig(**bad)  # type: ignore[arg-type]
