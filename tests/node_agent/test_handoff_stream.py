"""A streamed hand-off between two real agents over UCX (docs/disaggregation.md): the decode agent's
pull follows the prefill agent's prompt chunk by chunk while the prefill is still computing, its
tokens are those of a cache-less engine, and a prefill agent that dies mid-stream costs the decode
agent a recompute of what it did not get, never a wrong token or a leaked block. The prefill agent's
steps are held in their forward and let go one by one by the test, so every ordering is exact."""

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Iterator

import pytest

from radixmesh.node_agent.agent import NodeAgent
from radixmesh.node_agent.config import AgentConfig
from radixmesh.node_agent.engine.config import EngineConfig
from radixmesh.node_agent.engine.runner import EngineRunner
from radixmesh.node_agent.memory.config import MemoryConfig
from radixmesh.proto.events import Tier
from radixmesh.proto.ids import NodeId
from radixmesh.proto.serve.limits import usable_prefix_blocks
from radixmesh.proto.serve.plan import PullPlan, Queued, ServePlan, ServeResult
from radixmesh.proto.serve.sampling import FinishReason, SamplingParams
from tests.support.agents import SECRET, collect, plan, prompt, reference
from tests.support.poll import until
from tests.support.tiny_model import BS, SOURCE

pytestmark = pytest.mark.anyio
CHUNK_BLOCKS = 4
"""The prefill agent's step budget, in blocks: a prompt of n blocks is prefilled in n / 4 chunks."""
TOKENS = prompt(3, 14 * BS + 2)  # 14 full blocks, all usable: chunks of blocks [0, 4) [4, 8) [8, 12) [12, 14)
USABLE = usable_prefix_blocks(len(TOKENS), BS)


class StepGate:
    """Holds each step of an agent's engine in its forward (the pool lock let go, as a forward does,
    so the transfer plane's pins still run) until the test lets it through."""

    def __init__(self, runner: EngineRunner) -> None:
        self._inner = runner.engine.forward_gate
        self._through = threading.Semaphore(0)
        runner.engine.forward_gate = self._gate

    @contextlib.contextmanager
    def _gate(self) -> Iterator[None]:
        with self._inner():
            self._through.acquire()
            yield

    def let(self, steps: int = 1) -> None:
        self._through.release(steps)

    def open(self) -> None:
        self._through.release(1_000)


def config(node: str, budget_blocks: int = 64) -> AgentConfig:
    engine = EngineConfig(block_size=BS, max_num_batched_tokens=budget_blocks * BS,
                          memory=MemoryConfig(num_gpu_blocks=96))
    return AgentConfig(NodeId(node), model=SOURCE, engine=engine, transfer="ucx", secret=SECRET, pull_timeout_s=5.0)


@contextlib.asynccontextmanager
async def split_pair() -> AsyncIterator[tuple[NodeAgent, NodeAgent, StepGate]]:
    """A prefill agent whose steps are gated (chunks of CHUNK_BLOCKS blocks) and a decode agent."""
    prefill, decode = NodeAgent(config("prefill", CHUNK_BLOCKS)), NodeAgent(config("decode"))
    await prefill.start()
    await decode.start()
    gate = StepGate(prefill.runner)
    try:
        yield prefill, decode, gate
    finally:
        gate.open()
        await decode.stop()
        await prefill.stop()


def handoff(prefill: NodeAgent) -> ServePlan:
    pull = PullPlan(prefill.node, prefill.transfer_address, 0, USABLE, follow=True)
    return plan("r", TOKENS, pull=pull, handoff=True)


def prefill_only() -> ServePlan:
    return ServePlan("r-prefill", TOKENS, SamplingParams(max_tokens=1), prefill_only=True)


def served_to_peers(agent: NodeAgent) -> int:
    """Blocks of `agent`'s gpu cache matched by peers' pulls (it serves no request from its cache here)."""
    return agent.memory.gpu.cache.hit_blocks


async def test_the_decode_agent_pulls_each_chunk_while_the_prefill_computes_the_next() -> None:
    async with split_pair() as (prefill, decode, gate):
        async with contextlib.aclosing(prefill.serve(prefill_only())) as prefilling:
            assert await anext(prefilling) == Queued("r-prefill")
            decoding = asyncio.ensure_future(collect(decode.serve(handoff(prefill))))
            for chunk in (1, 2, 3):  # each chunk reaches the decode agent before the next is computed
                gate.let()
                await until(lambda chunk=chunk: served_to_peers(prefill) == chunk * CHUNK_BLOCKS,  # type: ignore[misc]
                            f"chunk {chunk} pulled")
                assert not decoding.done()
            gate.let()
            done = [item async for item in prefilling]
        assert len(done) == 1 and isinstance(done[0], ServeResult)
        assert (done[0].output_token_ids, done[0].finish_reason) == ((), FinishReason.PREFILLED)
        deltas, result = await decoding
        assert result.output_token_ids == reference(TOKENS) == tuple(t for d in deltas for t in d.token_ids)
        stats = result.stats
        assert stats.tokens.remote == USABLE * BS and stats.tokens.computed == len(TOKENS) - USABLE * BS
        assert not stats.pull_failed and stats.pull_bytes == USABLE * decode.layout.block_bytes
        for agent in (prefill, decode):
            await agent.check_invariants()
            assert agent.memory.block_counts(Tier.GPU).in_use == 0


async def test_a_prefill_agent_that_dies_mid_stream_costs_a_recompute_of_the_rest() -> None:
    async with split_pair() as (prefill, decode, gate):
        prefilling = prefill.serve(prefill_only())
        assert await anext(prefilling) == Queued("r-prefill")
        decoding = asyncio.ensure_future(collect(decode.serve(handoff(prefill))))
        gate.let()
        await until(lambda: served_to_peers(prefill) == CHUNK_BLOCKS, "the first chunk pulled")
        stopping = asyncio.ensure_future(prefill.stop())  # its transfer plane goes first: the pull is cut
        await until(lambda: prefill.transfer_address == "", "the prefill agent's transfer plane stopped")
        gate.open()  # its engine may now stop too
        await stopping
        with pytest.raises(RuntimeError):
            await anext(prefilling)
        await prefilling.aclose()
        _, result = await decoding
        assert result.output_token_ids == reference(TOKENS)
        assert result.stats.pull_failed and result.stats.tokens.remote == CHUNK_BLOCKS * BS
        await decode.check_invariants()
        assert decode.memory.block_counts(Tier.GPU).in_use == 0


async def test_a_prefill_only_plan_cannot_be_a_hand_off_too() -> None:
    async with split_pair() as (prefill, _, _):
        with pytest.raises(Exception, match="not both"):
            await anext(prefill.serve(plan("x", TOKENS, prefill_only=True, handoff=True)))
