"""Bring a deployment up and down on a Ray cluster: metadata service, node agents, router.

`up` needs a connected Ray driver (namespace NAMESPACE): `init_local_ray` starts one in this
process (`radixmesh up --local` and the demo keep it in the foreground), `ray.init(address=...)`
joins an existing cluster. Placement:

    --local N      N agents on this machine, each pinned to its own custom resource (a simulated
                   node), every server on 127.0.0.1, UCX over loopback TCP
    Ray cluster    one agent per GPU (num_gpus=1), or one on a CPU-only node that offers the
                   `radixmesh_agent` resource, pinned to its node (`node:<ip>`), serving transfers
                   on that node's address; router and metadata service on the head's, unless told
                   otherwise. Agents follow the cluster (reconcile.py).

Order: the metadata service (agents register with it), then the router actor, which creates the
agents, waits for the first ones and opens HTTP. `down` reverses it; it is idempotent.
"""

import asyncio
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import ray

from radixmesh.cluster.launch import worker_logging
from radixmesh.cluster.launch.config import NAMESPACE, LauncherConfig
from radixmesh.cluster.launch.local_ray import init_loopback_ray
from radixmesh.cluster.launch.metadata_actor import (
    METADATA_ACTOR,
    METADATA_STANDBY_ACTOR,
    failover_target,
    make_metadata_actor,
)
from radixmesh.cluster.launch.ray_auth import require_ray_token
from radixmesh.cluster.launch.reconcile import AGENT_RESOURCE, node_slots
from radixmesh.cluster.launch.router_actor import ROUTER_ACTOR, make_router_actor
from radixmesh.cluster.launch.secret_file import SECRET_ENV, NodeSecret
from radixmesh.cluster.launch.tls import with_tls
from radixmesh.node_agent import node_resource
from radixmesh.proto.ids import NodeId, agent_actor_name
from radixmesh.proto.metadata.nodes import NodeInfo

logger = logging.getLogger(__name__)


class DeploymentExists(Exception):
    """A deployment already runs on this Ray cluster (`radixmesh down` first)."""


@dataclass(frozen=True, slots=True)
class Deployment:
    """What `up` started."""

    router_url: str
    metadata_address: str
    nodes: tuple[NodeId, ...]


def local_resources(config: LauncherConfig) -> dict[str, float]:
    """Custom resources that make this machine hold `config.local_nodes` simulated nodes."""
    assert config.local_nodes is not None
    return {node_resource(n): 1.0 for n in config.node_ids(config.local_nodes)}


def local_cpus(config: LauncherConfig) -> int:
    """Logical CPUs Ray must offer: one per agent actor, and one spare for tasks."""
    assert config.local_nodes is not None
    return config.local_nodes + 1


def init_local_ray(config: LauncherConfig, log_to_driver: bool = False) -> None:
    """Start Ray in this process for `config.local_nodes` simulated nodes (node IP 127.0.0.1, no
    dashboard, token authentication on: ray_auth.py); `ray.shutdown()` ends it with the deployment.
    `log_to_driver`: the actors' log lines are printed by this process too (a foreground `up`).
    ValueError when Ray's token file is readable by other users.

    Its actors find `config.secret` in the environment they inherit from this Ray (RADIXMESH_SECRET,
    see secret_file.NodeSecret), never in their arguments: a deployment on this Ray runs with it."""
    require_ray_token()
    os.environ[SECRET_ENV] = config.secret.to_hex()
    init_loopback_ray(namespace=NAMESPACE, num_cpus=local_cpus(config), resources=local_resources(config),
                      log_to_driver=log_to_driver, configure_logging=False, runtime_env=job_runtime_env(config))


def job_runtime_env(config: LauncherConfig) -> dict[str, object]:
    """The Ray job's runtime_env: every actor it starts (metadata, router, agents) logs plain lines at
    `log_level` (worker_logging.py says why not ray.LoggingConfig)."""
    return worker_logging.runtime_env(config.log_level)


def check_room_for_agents(config: LauncherConfig) -> None:
    """Raises ValueError when the connected Ray cluster has no room for an agent now (later nodes
    get theirs as they join, but `up` needs one to learn the deployment's KV layout)."""
    if config.local_nodes is not None:
        nodes = config.node_ids(config.local_nodes)
        missing = [n for n in nodes if ray.cluster_resources().get(node_resource(n), 0) < 1]
        if missing:
            raise ValueError(f"the Ray cluster lacks the simulated-node resources of {missing} "
                             "(start it with init_local_ray or `radixmesh up --local N`)")
    elif not node_slots(ray.nodes()):
        raise ValueError(f"the Ray cluster has no node with a GPU or the {AGENT_RESOURCE!r} resource; "
                         "run `radixmesh up --local N` to simulate nodes")


def this_node_address() -> str:
    """The address of the Ray node this driver runs on (the head, under `ray up`)."""
    address: str = ray.util.get_node_ip_address()
    return address


def bind_here(config: LauncherConfig) -> LauncherConfig:
    """`config` with router and metadata bound to this Ray node's address when no host was given."""
    return config if config.host else replace(config, host=this_node_address())


async def up(config: LauncherConfig, progress: Callable[[str], None] | None = None) -> Deployment:
    """Start metadata service, agents and router on the connected Ray cluster, telling `progress`
    (default: this module's log) each phase as it ends: metadata service, each agent as it joins
    (its KV pool's size), router.

    Raises DeploymentExists when one runs already, ValueError for a placement that cannot be met;
    RayError when a part failed to start (no agent could: reconcile.AgentsDidNotStart inside it);
    a failure part-way takes down what was started.
    """
    report = progress or logger.info
    if any(_actor(name) is not None for name in (ROUTER_ACTOR, METADATA_ACTOR, METADATA_STANDBY_ACTOR)):
        raise DeploymentExists("a radixmesh deployment is already running on this Ray cluster")
    config = bind_here(config)
    check_room_for_agents(config)
    # Both servers bind `config.host`, an address of this node: their actors must run here.
    here = this_node_address()
    config = with_tls(config, here)  # before any actor: they are given the certificate it mints
    try:
        standby = config.metadata_standby
        secret = NodeSecret.of(config.secret, config.secret_file)  # never the secret itself (secret_file.py)
        metadata = make_metadata_actor(config.host, config.metadata_port, config.state, config.lease_ttl_s,
                                       secret, here, config.tls, leader_lease=standby)
        addresses = [await metadata.start.remote()]
        report(f"metadata service on {addresses[0]} (state {config.state})")
        if standby:  # after the active holds the leader key, so this one waits for it
            second = make_metadata_actor(config.host, 0, config.state, config.lease_ttl_s, secret, here,
                                         config.tls, name=METADATA_STANDBY_ACTOR, leader_lease=True)
            addresses.append(await second.start.remote(wait=False))
        address = failover_target(addresses)
        router = make_router_actor(config, address, here)
        random = ", seeded random weights" if config.model.weights is None else ""
        report(f"starting agents: model {config.served_model_name} ({config.engine_label} engine{random}), "
               "each loads it and sizes its KV pool")
        url = await _start_reporting_agents(router, report)
        nodes: list[NodeId] = await router.nodes.remote()
    except BaseException:
        await down()
        raise
    report(f"router on {url}")
    return Deployment(url, address, tuple(nodes))


PROGRESS_POLL_S = 0.5
"""How often `up` asks the router which agents have joined while it starts them (what the user sees)."""


async def _start_reporting_agents(router: Any, report: Callable[[str], None]) -> str:
    """Run the router's `start`, reporting each agent as it joins and each node whose agent could not
    start (once per cause: when some start and others fail, `up` serves without those, and the user
    must hear which and why, not find it in a Ray log); the router's URL."""
    start: asyncio.Future[str] = asyncio.ensure_future(router.start.remote())
    shown = 0
    told: dict[NodeId, str] = {}
    while True:
        await asyncio.wait([start], timeout=PROGRESS_POLL_S)
        joined: list[NodeInfo] = await router.joined.remote()
        for info in joined[shown:]:
            role = f" ({info.role})" if info.role != "both" else ""
            report(f"agent {info.node_id}{role} ready: KV pool {info.capacity_blocks} blocks of {info.block_size} "
                   f"tokens ({gib(info.capacity_blocks * info.block_bytes)}), transfer {info.transfer_address}")
        shown = len(joined)
        failed: dict[NodeId, str] = await router.failed.remote()
        for node, cause in sorted(failed.items()):
            if told.get(node) != cause:
                report(f"warning: agent {node} could not start: {cause} (retried every reconcile round; "
                       "the cluster serves without it meanwhile)")
        told.update(failed)
        if start.done():
            return start.result()


def gib(n_bytes: int) -> str:
    """`n_bytes` for people: GiB above one, else MiB."""
    return f"{n_bytes / 2**30:.2f} GiB" if n_bytes >= 2**30 else f"{n_bytes / 2**20:.1f} MiB"


async def down() -> bool:
    """Stop router (and the agents it owns) and the metadata service; False if nothing ran."""
    found = False
    router = _actor(ROUTER_ACTOR)
    if router is not None:
        found = True
        try:
            await router.stop.remote()
        except ray.exceptions.RayError as e:
            logger.warning("router did not stop cleanly: %s", e)
        ray.kill(router)
    # The standby first: stopped after the active, it would take the released leader key over.
    for name in (METADATA_STANDBY_ACTOR, METADATA_ACTOR):
        metadata = _actor(name)
        if metadata is not None:
            found = True
            try:
                await metadata.stop.remote()  # persists the index to the state store
            except ray.exceptions.RayError as e:
                logger.warning("metadata service %s did not stop cleanly: %s", name, e)
            ray.kill(metadata)
    return found


def router_handle() -> Any:
    """The running router actor; LookupError when none runs."""
    return _required(ROUTER_ACTOR)


def metadata_handle() -> Any:
    """The running metadata actor; LookupError when none runs."""
    return _required(METADATA_ACTOR)


def agent_handle(node: NodeId) -> Any:
    """The agent actor of `node`; LookupError when it does not run."""
    return _required(agent_actor_name(node))


def _required(name: str) -> Any:
    handle = _actor(name)
    if handle is None:
        raise LookupError(f"no actor {name!r} in namespace {NAMESPACE!r}: is radixmesh up?")
    return handle


def _actor(name: str) -> Any:
    try:
        return ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        return None
