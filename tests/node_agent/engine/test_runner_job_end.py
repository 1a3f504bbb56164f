"""The runner's job-end callback (what stirs an idle agent's publisher) runs after every job, each
step included: a request's last steps make cache events with no other job after them."""

import asyncio

from radixmesh.node_agent.engine.config import EngineConfig
from radixmesh.node_agent.engine.engine import Engine, StepOutput
from radixmesh.node_agent.engine.request import Request, RequestId
from radixmesh.node_agent.engine.runner import EngineRunner, Finished
from radixmesh.node_agent.memory.config import MemoryConfig
from radixmesh.proto.serve.sampling import SamplingParams
from tests.support.agents import prompt
from tests.support.tiny_model import BS, SOURCE


def test_the_callback_follows_the_submit_and_every_step() -> None:
    engine = Engine(SOURCE.load(), EngineConfig(block_size=BS, memory=MemoryConfig(num_gpu_blocks=64)))
    steps = 0
    step = engine.step

    def counted_step() -> StepOutput:
        nonlocal steps
        steps += 1
        return step()

    engine.step = counted_step  # type: ignore[method-assign]
    ends = 0

    def job_ended() -> None:
        nonlocal ends
        ends += 1

    async def scenario() -> None:
        runner = EngineRunner(engine, on_job_end=job_ended)
        queue = await runner.submit(Request(RequestId("r"), prompt(1, 10), SamplingParams(max_tokens=3, ignore_eos=True)))
        assert ends == 1  # the submit
        while not isinstance(item := await queue.get(), Finished):
            assert not isinstance(item, BaseException)
        assert steps >= 3 and ends == 1 + steps
        await runner.close()

    asyncio.run(scenario())
