"""Agents follow the cluster: every node that can hold an agent gets exactly one per GPU (or one, on a
CPU-only node that offers the custom resource AGENT_RESOURCE), started when the node joins and
dropped when it leaves.

`AgentReconciler` compares the slots the cluster offers now (`desired`) with the agents it runs and
closes the gap one round at a time: a new slot starts an agent (in the background), a gone slot's
agent leaves the directory and is killed (Ray would keep restarting it on a node that is not there;
its lease simply expires), a failed start is retried next round. A plain class (slots, starting
and stopping injected), so tests run it without Ray; the router actor runs it with `ray_slots` and
real agent actors.
"""

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import ray

from radixmesh.cluster.fleet.agent_client import AgentClient, RayAgentClient, StaticAgentDirectory
from radixmesh.cluster.launch.config import NAMESPACE, LauncherConfig
from radixmesh.cluster.launch.interface import interface_of
from radixmesh.cluster.launch.secret_file import NodeSecret
from radixmesh.node_agent import AgentPlacement, make_agent_actor, ucx_env
from radixmesh.proto.ids import NodeId, agent_actor_name
from radixmesh.proto.metadata.nodes import NodeInfo

logger = logging.getLogger(__name__)

AGENT_RESOURCE = "radixmesh_agent"
"""Custom resource a CPU-only Ray node offers to hold one agent (`ray start --resources=...`)."""
ROLE_RESOURCES = {"prefill": "radixmesh_prefill", "decode": "radixmesh_decode"}
"""Marker resources that give a Ray node's agents a role (docs/disaggregation.md): a node offering
`radixmesh_prefill` (any amount; nothing consumes it) runs prefill agents, `radixmesh_decode` decode
agents, one offering neither agents of role both."""


@dataclass(frozen=True, slots=True)
class AgentSlot:
    """One agent the cluster has room for."""

    node: NodeId
    host: str
    """Address of the Ray node it runs on: its transfer server binds it, UCX uses its interface."""
    placement: AgentPlacement
    role: str = "both"
    """The agent's role (proto.metadata.nodes.NODE_ROLES)."""


def simulated_slots(nodes: Iterable[NodeId], host: str, role_of: Callable[[NodeId], str] = lambda n: "both",
                    ) -> list[AgentSlot]:
    """`--local`: one agent per simulated node, each pinned by its own custom resource, on `host`."""
    return [AgentSlot(n, host, AgentPlacement.simulated(n), role_of(n)) for n in nodes]


def node_role(resources: Mapping[str, float]) -> str:
    """The role of a Ray node's agents, from its marker resources (ROLE_RESOURCES). ValueError for
    a node that offers both markers."""
    roles = [role for role, marker in ROLE_RESOURCES.items() if resources.get(marker, 0) > 0]
    if len(roles) > 1:
        raise ValueError(f"a Ray node offers both {' and '.join(ROLE_RESOURCES.values())}: give it one role")
    return roles[0] if roles else "both"


def node_slots(ray_nodes: Iterable[Mapping[str, Any]]) -> list[AgentSlot]:
    """The slots of the alive nodes in `ray_nodes` (records as `ray.nodes()` gives them): one per GPU,
    else one where AGENT_RESOURCE is offered. Ray gives every node a `node:<ip>` resource: a sliver
    of it pins the actor there."""
    out: list[AgentSlot] = []
    for node in ray_nodes:
        if not node["Alive"]:
            continue
        ip = node["NodeManagerAddress"]
        resources = node["Resources"]
        try:
            role = node_role(resources)
        except ValueError:
            logger.warning("Ray node %s offers both role resources: its agents do both", ip)
            role = "both"
        pin = (f"node:{ip}", 0.001)
        gpus = int(resources.get("GPU", 0))
        for gpu in range(gpus):
            out.append(AgentSlot(NodeId(f"{ip}-gpu{gpu}"), ip, AgentPlacement(num_gpus=1.0, resources=(pin,)), role))
        if gpus == 0 and resources.get(AGENT_RESOURCE, 0) >= 1:
            out.append(AgentSlot(NodeId(f"{ip}-cpu"), ip, AgentPlacement(resources=((AGENT_RESOURCE, 1.0), pin)),
                                 role))
    return sorted(out, key=lambda s: s.node)


async def ray_slots() -> list[AgentSlot]:
    """node_slots of the connected Ray cluster (ray.nodes() is a blocking GCS call: off the loop)."""
    return node_slots(await asyncio.to_thread(ray.nodes))


async def pinned_to_interface(slot: AgentSlot) -> AgentSlot:
    """`slot` with UCX held to the interface of its host address (UCX_NET_DEVICES), found by a task
    on that node: otherwise UCX opens its sockets on every interface of the node."""
    pin = dict(slot.placement.resources)
    find = ray.remote(interface_of).options(num_cpus=0, resources={k: v for k, v in pin.items()
                                                                    if k.startswith("node:")})
    device = await find.remote(slot.host)
    if device is None:
        raise ValueError(f"no interface of node {slot.node} has the address {slot.host}")
    # One Ethernet device: UCX's TCP transport then listens and connects on the agent's address
    # only. (An RDMA cluster would list its HCA too, e.g. "mlx5_0:1,eth0"; not handled here yet.)
    env = {**ucx_env(), "UCX_NET_DEVICES": device}
    return replace(slot, placement=replace(slot.placement, env_vars=tuple(sorted(env.items()))))


@dataclass(frozen=True, slots=True)
class StartedAgent:
    client: AgentClient
    info: NodeInfo


AGENT_STOP_TIMEOUT_S = 30.0
"""How long `down` waits for an agent to stop before killing it: time for its disk tier to write its
queue (256 MiB at most, see DiskConfig.queue_bytes)."""

StartAgent = Callable[[AgentSlot], Awaitable[StartedAgent]]
StopAgent = Callable[[NodeId], Awaitable[None]]


class AgentReconciler:
    """Keeps `directory` holding one started agent per slot of `desired()`.

    `start` creates an agent and waits until it runs (raising when it cannot); one that has not
    started within `start_timeout_s` counts as failed. Starts run as their own tasks, so a slow one
    holds up no other join or leave. `stop` ends one (a no-op for an agent that does not exist).
    `accept(info, infos)` vets a started agent against those already running (e.g. one KV layout
    per deployment) and raises ValueError to refuse it. Use from one event loop.
    """

    def __init__(self, desired: Callable[[], Awaitable[list[AgentSlot]]], start: StartAgent, stop: StopAgent,
                 directory: StaticAgentDirectory, accept: Callable[[NodeInfo, list[NodeInfo]], None],
                 start_timeout_s: float = 300.0) -> None:
        self._desired = desired
        self._start = start
        self._stop = stop
        self._accept = accept
        self._start_timeout_s = start_timeout_s
        self.directory = directory
        self.infos: dict[NodeId, NodeInfo] = {}
        self._starting: dict[NodeId, asyncio.Task[None]] = {}
        self._task: asyncio.Task[None] | None = None
        self.failures: dict[NodeId, str] = {}
        """Why each node's last start failed (one line), until it joins."""
        self.on_join: Callable[[NodeInfo], None] = lambda info: None
        """Told of every agent that joins (the router reports `up`'s progress with it)."""

    async def reconcile(self) -> None:
        """One round: stop the agents whose slot is gone (or is still starting), start the missing
        ones in the background (`settle` waits for them)."""
        slots = {s.node: s for s in await self._desired()}
        for node in sorted(set(self._starting) - slots.keys()):
            self._starting.pop(node).cancel()
            await self._stop(node)
        for node in sorted(set(self.directory.nodes()) - slots.keys()):
            logger.info("node %s left the cluster: stopping its agent (its lease will expire)", node)
            self.directory.remove(node)
            self.infos.pop(node, None)
            await self._stop(node)
        for node in sorted(slots.keys() - set(self.directory.nodes()) - set(self._starting)):
            self._starting[node] = asyncio.create_task(self._join(slots[node]))

    async def settle(self) -> None:
        """Wait until every start under way has ended (joined, failed or been refused)."""
        await asyncio.gather(*self._starting.values(), return_exceptions=True)

    async def _join(self, slot: AgentSlot) -> None:
        try:
            async with asyncio.timeout(self._start_timeout_s):
                result = await self._start(slot)
            self._accept(result.info, list(self.infos.values()))
        except Exception as e:  # failed, timed out or refused: the next round tries again
            logger.warning("agent for %s did not join", slot.node, exc_info=True)
            self.failures[slot.node] = failure_line(e)
            self._starting.pop(slot.node, None)
            await self._stop(slot.node)
            return
        self._starting.pop(slot.node, None)
        self.directory.add(result.client, result.info.role)
        self.infos[slot.node] = result.info
        self.failures.pop(slot.node, None)
        self.on_join(result.info)
        logger.info("agent %s joined (epoch %d, transfer %s)", slot.node, result.info.epoch,
                    result.info.transfer_address)

    async def until_any(self, interval_s: float) -> None:
        """Reconcile until at least one agent runs (waiting for the starts of each round).

        Raises AgentsDidNotStart when a round ends with no agent running and at least one start
        failed: a deployment's agents share one configuration, so what failed one (a disk folder it
        cannot make, a secret its node lacks, a model it cannot load) fails the next round too, and
        `up` would otherwise retry for ever. Rounds that offer no slot yet keep waiting."""
        while True:
            self.failures.clear()
            await self.reconcile()
            await self.settle()
            if self.directory.nodes():
                return
            if self.failures:
                raise AgentsDidNotStart.of(self.failures)
            await asyncio.sleep(interval_s)  # the reconcile period: nodes join on their own time

    def follow(self, interval_s: float) -> None:
        """Reconcile every `interval_s` in the background until `close`."""
        self._task = asyncio.create_task(self._loop(interval_s))

    async def _loop(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)  # the reconcile period
            try:
                await self.reconcile()
            except Exception:  # a failed round (GCS briefly unreachable) must not end following
                logger.exception("reconcile round failed")

    async def stop_all(self) -> None:
        """Stop every agent this reconciler runs (after `close`: none starts again)."""
        nodes = self.directory.nodes()
        for node in nodes:
            self.directory.remove(node)
            self.infos.pop(node, None)
        await asyncio.gather(*(self._stop(n) for n in nodes))

    async def close(self) -> None:
        for task in self._starting.values():
            task.cancel()
        await asyncio.gather(*self._starting.values(), return_exceptions=True)
        self._starting.clear()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None



class AgentsDidNotStart(RuntimeError):
    """No agent of a deployment started; the message names the first node's error, in one line.
    (Made by `of`: the one-argument constructor is what unpickling calls, across Ray.)"""

    @classmethod
    def of(cls, failures: Mapping[NodeId, str]) -> "AgentsDidNotStart":
        first = min(failures)
        more = f" (and {len(failures) - 1} more node(s) failed)" if len(failures) > 1 else ""
        return cls(f"no agent could start: {first}: {failures[first]}{more}")


def failure_line(e: BaseException) -> str:
    """`e` in one line: the innermost cause (inside a Ray actor's traceback, the agent's own error)."""
    while True:
        inner = getattr(e, "cause", None) if isinstance(e, ray.exceptions.RayTaskError) else e.__cause__
        if not isinstance(inner, BaseException):
            break
        e = inner
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return f"{type(e).__name__}: {lines[-1]}" if lines else type(e).__name__


class RayAgents:
    """The agent actors of one deployment: which slots the cluster offers, start, stop.

    The process that calls `start` owns the actors (the router actor: they live as long as it does).
    """

    def __init__(self, config: LauncherConfig, metadata_address: str) -> None:
        self._config = config
        self._metadata_address = metadata_address
        self._handles: dict[NodeId, Any] = {}

    async def desired(self) -> list[AgentSlot]:
        cfg = self._config
        if cfg.local_nodes is not None:
            return simulated_slots(cfg.node_ids(cfg.local_nodes), cfg.host, cfg.role_of)
        return await ray_slots()

    async def start(self, slot: AgentSlot) -> StartedAgent:
        """Create `slot`'s agent actor and wait until it has started (raises when it cannot)."""
        if self._config.local_nodes is None:
            slot = await pinned_to_interface(slot)
        config = replace(self._config.agent_config(slot.node, self._metadata_address, slot.host), role=slot.role)
        handle = make_agent_actor(config, slot.placement, NodeSecret.of(self._config.secret, self._config.secret_file))
        self._handles[slot.node] = handle
        client = RayAgentClient(slot.node, handle)
        return StartedAgent(client, await client.start())

    async def stop(self, node: NodeId) -> None:
        """Stop `node`'s agent, then kill its actor for good (no restart); nothing when there is none.

        The agent is asked to stop first (at most AGENT_STOP_TIMEOUT_S): its disk tier's writer then
        writes what is still queued, which a kill would lose, and a restart over the same disk would
        start colder. An agent on a node that is gone fails the call at once and is killed."""
        handle = self._handles.pop(node, None)
        if handle is None:
            with contextlib.suppress(ValueError):
                handle = ray.get_actor(agent_actor_name(node), namespace=NAMESPACE)
        if handle is None:
            return
        try:
            async with asyncio.timeout(AGENT_STOP_TIMEOUT_S):
                await handle.stop.remote()
        except (TimeoutError, ray.exceptions.RayError) as e:
            logger.warning("agent %s did not stop cleanly (killed): %r", node, e)
        ray.kill(handle, no_restart=True)
