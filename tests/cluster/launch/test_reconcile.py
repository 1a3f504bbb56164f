"""Agents follow the cluster (cluster/launch/reconcile.py), without Ray: which slots the cluster's
nodes offer, and the reconcile rounds as nodes join, leave, fail to start or disagree on layout."""

import asyncio
import pickle
from collections.abc import AsyncIterator, Callable
from types import SimpleNamespace

import pytest

from radixmesh.cluster.fleet.agent_client import StaticAgentDirectory
from radixmesh.cluster.launch import launcher
from radixmesh.cluster.launch.interface import interface_of
from radixmesh.cluster.launch.reconcile import (
    AGENT_RESOURCE,
    AgentReconciler,
    AgentsDidNotStart,
    AgentSlot,
    StartedAgent,
    failure_line,
    node_slots,
)
from radixmesh.cluster.launch.router_actor import one_layout
from radixmesh.node_agent.actor import AgentPlacement
from radixmesh.proto.ids import NodeId
from radixmesh.proto.metadata.nodes import NodeInfo
from radixmesh.proto.serve.plan import ServeItem, ServePlan
from tests.support.poll import until


def ray_node(ip: str, resources: dict[str, float] | None = None, alive: bool = True) -> dict[str, object]:
    """A record as ray.nodes() gives it."""
    return {"NodeManagerAddress": ip, "Alive": alive, "Resources": {"CPU": 4.0, f"node:{ip}": 1.0, **(resources or {})}}


def test_one_slot_per_gpu_or_one_per_cpu_node_offering_the_agent_resource() -> None:
    slots = node_slots([ray_node("10.0.0.1"), ray_node("10.0.0.2", {"GPU": 2}), ray_node("10.0.0.3", {AGENT_RESOURCE: 1}),
                        ray_node("10.0.0.4", {"GPU": 1}, alive=False), ray_node("10.0.0.5", {"GPU": 1, AGENT_RESOURCE: 1})])
    assert [(s.node, s.host) for s in slots] == [
        ("10.0.0.2-gpu0", "10.0.0.2"), ("10.0.0.2-gpu1", "10.0.0.2"), ("10.0.0.3-cpu", "10.0.0.3"),
        ("10.0.0.5-gpu0", "10.0.0.5")]
    gpu, _, cpu, _ = slots
    assert gpu.placement == AgentPlacement(num_gpus=1.0, resources=(("node:10.0.0.2", 0.001),))
    assert cpu.placement == AgentPlacement(resources=((AGENT_RESOURCE, 1.0), ("node:10.0.0.3", 0.001)))


def test_interface_of_an_address() -> None:
    assert interface_of("127.0.0.1") == "lo"
    assert interface_of("203.0.113.7") is None  # TEST-NET-3: on no interface here


async def settled(r: AgentReconciler) -> None:
    """One reconcile round, and the starts it began."""
    await r.reconcile()
    await r.settle()


class IdleAgent:
    """An AgentClient that serves nothing (the reconciler only files it in the directory)."""

    def __init__(self, node: NodeId) -> None:
        self.node = node

    async def serve(self, plan: ServePlan) -> AsyncIterator[ServeItem]:
        raise AssertionError("not served in these tests")
        yield

    async def prometheus_text(self) -> str:
        return ""

    async def scrape_target(self) -> None:
        return None


class FakeCluster:
    """Slots that tests change between rounds, and a record of what was started and stopped."""

    def __init__(self) -> None:
        self.slots: list[AgentSlot] = []
        self.started: list[NodeId] = []
        self.stopped: list[NodeId] = []
        self.failing: set[NodeId] = set()
        self.layouts: dict[NodeId, str] = {}

    def offer(self, *nodes: str) -> None:
        self.slots = [AgentSlot(NodeId(n), "10.0.0.1", AgentPlacement()) for n in nodes]

    async def desired(self) -> list[AgentSlot]:
        return self.slots

    async def start(self, slot: AgentSlot) -> StartedAgent:
        self.started.append(slot.node)
        if slot.node in self.failing:
            raise RuntimeError("the node went away while its agent started")
        info = NodeInfo(slot.node, 1, self.layouts.get(slot.node, "layout-a"), 16, 4096, "10.0.0.1:1", 64)
        return StartedAgent(IdleAgent(slot.node), info)

    async def stop(self, node: NodeId) -> None:
        self.stopped.append(node)

    def reconciler(self) -> AgentReconciler:
        return AgentReconciler(self.desired, self.start, self.stop, StaticAgentDirectory([]), accept=one_layout)


@pytest.mark.anyio
async def test_nodes_that_join_get_an_agent_and_nodes_that_leave_lose_it() -> None:
    cluster = FakeCluster()
    r = cluster.reconciler()
    cluster.offer("a", "b")
    await settled(r)
    assert r.directory.nodes() == ["a", "b"] and sorted(r.infos) == ["a", "b"]
    cluster.offer("a", "b", "c")  # c joins
    await settled(r)
    assert r.directory.nodes() == ["a", "b", "c"] and cluster.started == ["a", "b", "c"]
    cluster.offer("a", "c")  # b leaves: its agent is stopped, its lease left to expire
    await settled(r)
    assert r.directory.nodes() == ["a", "c"] and cluster.stopped == ["b"] and sorted(r.infos) == ["a", "c"]
    await r.reconcile()  # nothing changed: nothing started or stopped
    assert cluster.started == ["a", "b", "c"] and cluster.stopped == ["b"]


@pytest.mark.anyio
async def test_stop_all_stops_every_running_agent_and_starts_none_after_close() -> None:
    cluster = FakeCluster()
    r = cluster.reconciler()
    cluster.offer("a", "b")
    await settled(r)
    await r.close()
    await r.stop_all()
    assert sorted(cluster.stopped) == ["a", "b"] and r.directory.nodes() == [] and not r.infos
    await r.stop_all()  # nothing left to stop
    assert sorted(cluster.stopped) == ["a", "b"]


@pytest.mark.anyio
async def test_an_agent_that_fails_to_start_is_retried_next_round() -> None:
    cluster = FakeCluster()
    r = cluster.reconciler()
    cluster.offer("a", "b")
    cluster.failing = {NodeId("b")}
    await settled(r)
    assert r.directory.nodes() == ["a"] and cluster.stopped == ["b"]
    cluster.failing = set()
    await settled(r)
    assert r.directory.nodes() == ["a", "b"] and cluster.started == ["a", "b", "b"]


@pytest.mark.anyio
async def test_a_slow_start_holds_up_no_other_node() -> None:
    cluster = FakeCluster()
    release = asyncio.Event()
    start = cluster.start

    async def slow_for_a(slot: AgentSlot) -> StartedAgent:
        if slot.node == "a":
            await release.wait()
        return await start(slot)

    cluster.start = slow_for_a  # type: ignore[method-assign]
    r = cluster.reconciler()
    cluster.offer("a")
    await r.reconcile()
    cluster.offer("a", "b")
    await r.reconcile()
    await until(lambda: r.directory.nodes() == ["b"], timeout_s=5, pause_s=0)
    release.set()
    await r.settle()
    assert r.directory.nodes() == ["a", "b"]


@pytest.mark.anyio
async def test_an_agent_with_another_kv_layout_is_refused() -> None:
    cluster = FakeCluster()
    r = cluster.reconciler()
    cluster.offer("a")
    await settled(r)
    cluster.layouts[NodeId("b")] = "layout-b"
    cluster.offer("a", "b")
    await settled(r)
    assert r.directory.nodes() == ["a"] and cluster.stopped == ["b"]


@pytest.mark.anyio
async def test_until_any_returns_once_an_agent_runs() -> None:
    cluster = FakeCluster()
    r = cluster.reconciler()
    cluster.offer("a")
    await r.until_any(interval_s=0.0)
    assert r.directory.nodes() == ["a"]


@pytest.mark.anyio
async def test_until_any_gives_up_with_the_first_error_when_no_agent_could_start() -> None:
    # `up` with an agent that cannot start (issue 40) retried for ever; every agent shares its
    # configuration, so a round in which all fail ends the wait, naming the first node's error.
    cluster = FakeCluster()
    r = cluster.reconciler()
    cluster.offer("a", "b")
    cluster.failing = {NodeId("a"), NodeId("b")}
    with pytest.raises(AgentsDidNotStart) as e:
        await r.until_any(interval_s=0.0)
    assert str(e.value) == ("no agent could start: a: RuntimeError: the node went away while its agent started "
                            "(and 1 more node(s) failed)")
    assert cluster.started == ["a", "b"]  # one round, no retries


def test_a_failure_is_one_line_naming_the_innermost_cause() -> None:
    try:
        try:
            raise NotADirectoryError(20, "Not a directory", "/tmp/f/kv/node-0")
        except OSError as inner:
            raise RuntimeError("agent node-0: Traceback (most recent call last):\n  ...\nmany lines") from inner
    except RuntimeError as outer:
        line = failure_line(outer)
    assert line == "NotADirectoryError: [Errno 20] Not a directory: '/tmp/f/kv/node-0'"
    # Unpickled across Ray from its message alone, it keeps that message.
    error = AgentsDidNotStart.of({NodeId("a"): line})
    assert str(pickle.loads(pickle.dumps(error))) == str(error)


class _Call:
    """A Ray actor method's stand-in: `.remote()` gives an awaitable of what `fn` returns now."""

    def __init__(self, fn: Callable[[], object]) -> None:
        self._fn = fn

    def remote(self) -> "asyncio.Future[object]":
        future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        future.set_result(self._fn())
        return future


@pytest.mark.anyio
async def test_up_names_each_node_whose_agent_could_not_start_while_others_serve(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # issue 40: a worker without the secret failed to start while the head's agent ran; `up` said it was
    # up and named nothing (the cause was only in the router actor's log). Now each failed node is named
    # with its cause, once per cause, while the start goes on and after it.
    monkeypatch.setattr(launcher, "PROGRESS_POLL_S", 0.0)
    done: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    asked = 0

    def failed() -> dict[NodeId, str]:
        nonlocal asked
        asked += 1
        if asked == 3:  # the start ends after a few polls, with node b still failing
            done.set_result("http://127.0.0.1:8000")
        return {NodeId("b"): "PermissionError: the cluster secret is missing on this node"}

    a = NodeInfo(NodeId("a"), 1, "layout", 16, 4096, "127.0.0.1:1", 8)
    router = SimpleNamespace(start=SimpleNamespace(remote=lambda: done), joined=_Call(lambda: [a]), failed=_Call(failed))
    lines: list[str] = []
    assert await launcher._start_reporting_agents(router, lines.append) == "http://127.0.0.1:8000"
    assert lines == [
        "agent a ready: KV pool 8 blocks of 16 tokens (0.0 MiB), transfer 127.0.0.1:1",
        ("warning: agent b could not start: PermissionError: the cluster secret is missing on this node (retried "
         "every reconcile round; the cluster serves without it meanwhile)"),
    ]
