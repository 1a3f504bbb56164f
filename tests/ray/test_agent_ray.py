"""Agent actors on a local Ray cluster (node IP 127.0.0.1): streaming through RayAgentClient, a pull
between two actors over UCX and one through the Ray object store, refusal as ValueError, restart with
a higher epoch, death as AgentUnavailable."""

from collections.abc import Iterator

import pytest
import ray

from radixmesh.cluster.fleet.agent_client import AgentUnavailable, RayAgentClient
from radixmesh.cluster.launch.local_ray import init_loopback_ray
from radixmesh.node_agent.actor import AgentPlacement, make_agent_actor, node_resource
from radixmesh.proto.ids import NodeId
from radixmesh.proto.serve.plan import PullPlan, TokenDelta
from tests.support.agents import agent_config, collect, plan, prompt, reference

pytestmark = [pytest.mark.ray, pytest.mark.anyio, pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    resources = {node_resource(NodeId(n)): 1.0 for n in ("a", "b", "c", "d")}
    init_loopback_ray(num_cpus=4, resources=resources, log_to_driver=False)
    yield
    ray.shutdown()


def actor(node: str, transfer: str = "ucx") -> RayAgentClient:
    config = agent_config(node, transfer=transfer, pull_timeout_s=10.0)
    placement = AgentPlacement.simulated(NodeId(node))
    return RayAgentClient(NodeId(node), make_agent_actor(config, placement))


async def test_actors_stream_pull_restart_and_die(ray_cluster: None) -> None:
    a, b = actor("a"), actor("b")
    info_a = await a.start()
    await b.start()
    tokens = prompt(40, 30)
    deltas, first = await collect(a.serve(plan("r1", tokens)))
    assert first.output_token_ids == reference(tokens) and first.node == "a"
    assert tuple(t for d in deltas for t in d.token_ids) == first.output_token_ids

    pull = PullPlan(NodeId("a"), info_a.transfer_address, 0, 7)
    _, pulled = await collect(b.serve(plan("r2", tokens, pull=pull)))
    assert pulled.output_token_ids == first.output_token_ids
    assert (pulled.stats.tokens.remote, pulled.stats.pull_failed) == (28, False)
    await a.handle.check_invariants.remote()
    await b.handle.check_invariants.remote()
    assert "radixmesh_agent_requests_total" in await b.prometheus_text()

    with pytest.raises(ValueError, match="vocabulary|lie in"):
        await collect(b.serve(plan("bad", (1, 999))))

    ray.kill(a.handle, no_restart=False)  # Ray restarts it: a new incarnation with an empty cache
    # ray.kill returns before the actor is gone: a call may still reach the old incarnation, so ask
    # until the new one answers (each ask is a round trip to the actor, bounded by the test timeout).
    restarted = await a.start()
    while restarted.epoch == info_a.epoch:
        restarted = await a.start()
    assert restarted.epoch > info_a.epoch
    _, again = await collect(a.serve(plan("r3", tokens)))
    assert again.stats.tokens.local_gpu == 0 and again.output_token_ids == first.output_token_ids

    stream = b.serve(plan("r4", prompt(41, 12), max_tokens=50))
    assert isinstance(await anext(stream), TokenDelta)
    ray.kill(b.handle, no_restart=True)
    with pytest.raises(AgentUnavailable):
        await collect(stream)
    with pytest.raises(AgentUnavailable):
        await b.prometheus_text()


async def test_ray_transport_pulls_through_the_owners_actor(ray_cluster: None) -> None:
    owner, puller = actor("c", transfer="ray"), actor("d", transfer="ray")
    info = await owner.start()
    await puller.start()
    assert info.transfer_address == "ray:radixmesh-agent-c"
    tokens = prompt(43, 30)  # 7 full blocks; 7 usable (the 30th token is computed)
    _, first = await collect(owner.serve(plan("o", tokens)))

    pull = PullPlan(NodeId("c"), info.transfer_address, 0, 7)
    _, got = await collect(puller.serve(plan("p", tokens, pull=pull)))
    assert got.output_token_ids == first.output_token_ids == reference(tokens)
    s = got.stats
    assert (s.tokens.remote, s.tokens.computed, s.pull_failed) == (28, 2, False)
    assert s.pull_bytes > 0 and "c" in (await puller.handle.load.remote()).pull_gbps
    # The owner's pins ended with the stream: every block is free or cached-evictable again.
    assert (await owner.handle.load.remote()).free_blocks == 96
    await owner.handle.check_invariants.remote()
    await puller.handle.check_invariants.remote()
    for client in (owner, puller):
        ray.kill(client.handle, no_restart=True)
