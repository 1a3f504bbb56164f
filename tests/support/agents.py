"""One NodeAgent's test parts, in-process: its config (the tiny model, a shared secret), prompts and
plans, the cache-less reference output, a served stream collected, and two agents over UCX."""

import contextlib
from collections.abc import AsyncIterator

from radixmesh.common.secret import ClusterSecret
from radixmesh.node_agent.agent import NodeAgent
from radixmesh.node_agent.config import AgentConfig
from radixmesh.node_agent.engine.config import EngineConfig
from radixmesh.node_agent.engine.engine import Engine
from radixmesh.node_agent.engine.request import Request, RequestId
from radixmesh.node_agent.memory.config import MemoryConfig
from radixmesh.proto.ids import NodeId
from radixmesh.proto.serve.plan import ServeItem, ServePlan, ServeResult, TokenDelta
from radixmesh.proto.serve.sampling import SamplingParams
from tests.support.tiny_model import BS, SOURCE

SECRET = ClusterSecret.generate()
"""Shared by every agent here, as the launcher shares one per deployment."""


def agent_config(node: str, **kw: object) -> AgentConfig:
    engine = EngineConfig(block_size=BS, memory=MemoryConfig(num_gpu_blocks=96))
    options: dict[str, object] = {"transfer": "none", "secret": SECRET, **kw}
    return AgentConfig(NodeId(node), model=SOURCE, engine=engine, **options)  # type: ignore[arg-type]


def prompt(seed: int, n: int) -> tuple[int, ...]:
    return tuple((seed * 31 + i * 7) % 250 for i in range(n))


def plan(rid: str, tokens: tuple[int, ...], max_tokens: int = 6, **kw: object) -> ServePlan:
    return ServePlan(rid, tokens, SamplingParams(max_tokens=max_tokens, ignore_eos=True), **kw)  # type: ignore[arg-type]


def reference(tokens: tuple[int, ...], max_tokens: int = 6) -> tuple[int, ...]:
    """Output of one cache-less engine with the same weights."""
    engine = Engine(SOURCE.load(), EngineConfig(block_size=BS, model_id=SOURCE.identity(),
                                        memory=MemoryConfig(num_gpu_blocks=96, enable_prefix_caching=False)))
    req = Request(RequestId("r"), tokens, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    return engine.generate([req])[0].output_token_ids


async def collect(stream: AsyncIterator[ServeItem]) -> tuple[list[TokenDelta], ServeResult]:
    items = [item async for item in stream]
    assert isinstance(items[-1], ServeResult) and all(isinstance(i, TokenDelta) for i in items[:-1])
    return items[:-1], items[-1]  # type: ignore[return-value]


@contextlib.asynccontextmanager
async def ucx_pair(handoff: bool = False) -> AsyncIterator[tuple[NodeAgent, NodeAgent]]:
    """Two started agents over UCX: an owner (`handoff`: it evicts what a peer pulled first) and a puller."""
    owner = NodeAgent(agent_config("owner", transfer="ucx", pull_timeout_s=5.0, handoff=handoff))
    puller = NodeAgent(agent_config("puller", transfer="ucx", pull_timeout_s=5.0))
    await owner.start()
    await puller.start()
    try:
        yield owner, puller
    finally:
        await puller.stop()
        await owner.stop()
