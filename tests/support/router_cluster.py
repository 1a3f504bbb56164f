"""A small in-process cluster for the router's tests: real NodeAgents (tiny seeded model), a real
metadata gRPC server on 127.0.0.1, and a Router over them."""

import contextlib
import random
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from radixmesh.cluster.fleet.agent_client import LocalAgentClient, StaticAgentDirectory
from radixmesh.cluster.metadata.server import MetadataServer
from radixmesh.cluster.metadata.service import MetadataService
from radixmesh.cluster.policy.base import PolicyConfig
from radixmesh.cluster.router.config import RouterConfig
from radixmesh.cluster.router.router import Router
from radixmesh.common.metadata.auth import CallerCredentials
from radixmesh.common.metadata.client import MetadataClient
from radixmesh.common.secret import ClusterSecret
from radixmesh.node_agent.agent import NodeAgent
from radixmesh.node_agent.config import AgentConfig
from radixmesh.node_agent.engine.config import EngineConfig
from radixmesh.node_agent.engine.engine import Engine
from radixmesh.node_agent.engine.request import Request, RequestId
from radixmesh.node_agent.memory.config import MemoryConfig
from radixmesh.node_agent.model.source import ModelSource
from radixmesh.proto.ids import NodeId
from radixmesh.proto.serve.sampling import SamplingParams
from tests.support.poll import until
from tests.support.servers import start_metadata_server
from tests.support.tiny_model import BS, MODEL, MODEL_NAME, SOURCE

SECRET = ClusterSecret.generate()
"""The test cluster's secret: agents pull from each other only when they share one."""

MATCH_TIMEOUT_S = 10.0
"""`local_cluster`'s Match deadline (the router's and its metadata client's) unless a test sets one.
The product's 0.5 s is not what these tests are about, and on a loaded box a Match can outlast it:
the router then routes that request by its fallback policy, and a test asserting the policy or the
prefix hits fails for the box's load. A stopped service still fails a Match at once (connection
refused), so the outage tests wait no longer for it."""


def agent_config(node: str, metadata: str | None = None, transfer: str = "none", gpu_blocks: int = 256,
                 role: str = "both", source: ModelSource = SOURCE) -> AgentConfig:
    engine = EngineConfig(block_size=BS, memory=MemoryConfig(num_gpu_blocks=gpu_blocks))
    return AgentConfig(NodeId(node), model=source, served_model_name=MODEL_NAME, engine=engine, transfer=transfer,
                       secret=SECRET, metadata_address=metadata, heartbeat_interval_s=0.2, publish_interval_s=0.01,
                       role=role)


def reference(tokens: Sequence[int], sampling: SamplingParams) -> tuple[int, ...]:
    """Output of one cache-less engine with the agents' weights."""
    engine = Engine(SOURCE.load(), EngineConfig(block_size=BS, model_id=SOURCE.identity(),
                                        memory=MemoryConfig(num_gpu_blocks=256, enable_prefix_caching=False)))
    return engine.generate([Request(RequestId("ref"), tuple(tokens), sampling)])[0].output_token_ids


def router_config(layout: str, **kw: object) -> RouterConfig:
    defaults: dict[str, object] = {
        "block_size": BS, "model_name": MODEL_NAME, "limits": MODEL.prompt_limits(),
        "metadata_retry_s": 0.0,
    }
    return RouterConfig(layout, **{**defaults, **kw})  # type: ignore[arg-type]


class ManualClock:
    """A settable clock: tests move time explicitly (pending expiry, metadata retry)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Cluster:
    agents: list[NodeAgent]
    router: Router
    directory: StaticAgentDirectory
    clock: ManualClock
    servers: list[MetadataServer] = field(default_factory=list)
    """Metadata servers started (the live one last); all are stopped at the end."""
    port: int = 0

    def agent(self, node: str) -> NodeAgent:
        return next(a for a in self.agents if a.node == node)

    @property
    def service(self) -> MetadataService:
        return self.servers[-1].service

    async def router_in_sync(self) -> None:
        """Start the router's index watch and wait until its replica knows every agent (their transfer
        addresses: a split cluster's hand-off needs them)."""
        r = self.router
        assert r.watcher is not None
        r.start()
        await until(lambda: r.watcher is not None and r.watcher.replica.in_sync
                    and len(r.watcher.replica.nodes()) == len(self.agents), "the router's replica knows every agent")


async def start_metadata(port: int = 0) -> tuple[MetadataServer, int]:
    """A metadata service that admits only holders of SECRET, as `radixmesh up` starts it."""
    return await start_metadata_server(port=port, secret=SECRET)


@contextlib.asynccontextmanager
async def local_cluster(n: int, *, with_metadata: bool = True, publish: bool = False, transfer: str = "none",
                        seed: int = 0, gpu_blocks: int = 256, roles: Sequence[str] = (),
                        source: ModelSource = SOURCE, **router_kw: object) -> AsyncIterator[Cluster]:
    """`n` agents "a", "b", ... and a router; with `publish` the agents register with the metadata
    service and publish their cache events to it; `roles`: the agents' roles in order (default all
    "both"); `source`: their model (the tiny seeded one; another needs its `limits` passed too).
    Checks the router's invariants at the end."""
    servers, port = [], 0
    if with_metadata:
        server, port = await start_metadata()
        servers.append(server)
    address = f"127.0.0.1:{port}" if publish else None
    roles = tuple(roles) or ("both",) * n
    agents = [NodeAgent(agent_config(chr(ord("a") + i), address, transfer, gpu_blocks, roles[i], source))
              for i in range(n)]
    client = (MetadataClient(f"127.0.0.1:{port}", credentials=CallerCredentials.cluster(SECRET),
                             timeout_s=MATCH_TIMEOUT_S)
              if with_metadata else None)
    clock = ManualClock()
    try:
        for a in agents:
            await a.start()
        directory = StaticAgentDirectory([LocalAgentClient(a) for a in agents], {a.node: a.config.role for a in agents})
        layout = agents[0].layout
        router_kw.setdefault("policy_config", PolicyConfig(block_bytes=layout.block_bytes))
        router_kw.setdefault("match_timeout_s", MATCH_TIMEOUT_S)
        config = router_config(layout.fingerprint(), **router_kw)
        router = Router(config, directory, client, clock=clock, rng=random.Random(seed))
        cluster = Cluster(agents, router, directory, clock, servers, port)
        yield cluster
        router.check_invariants()
        await router.close()
    finally:
        for a in agents:
            await a.stop()
        if client is not None:
            await client.close()
        for s in servers:
            await s.stop(0)
