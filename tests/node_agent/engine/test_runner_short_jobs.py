"""The runner's short jobs (a pull's pins, allocations, inserts) run while a step's forward does, under
the pool lock the step lets go of only for its forward; everything else still waits for the step."""

import asyncio
import threading

from radixmesh.node_agent.engine.config import EngineConfig
from radixmesh.node_agent.engine.engine import Engine
from radixmesh.node_agent.engine.request import Request, RequestId
from radixmesh.node_agent.engine.runner import EngineRunner, Finished
from radixmesh.node_agent.memory.config import MemoryConfig
from radixmesh.node_agent.model.modeled.forward import ModeledModel
from radixmesh.node_agent.model.modeled.profile import load_profile
from radixmesh.node_agent.model.modeled.time_model import StepTimeModel
from radixmesh.proto.events import Tier
from radixmesh.proto.serve.sampling import SamplingParams
from tests.support.agents import prompt
from tests.support.tiny_model import BS, SOURCE

WAIT_S = 30.0
"""Bound on each wait for the other thread, far above what it takes on a loaded box."""


def test_a_short_job_runs_during_a_forward_and_a_call_waits_for_the_step() -> None:
    in_forward, release = threading.Event(), threading.Event()

    def forward_wait(_: float) -> None:  # the modeled forward's wait: held until the test says
        in_forward.set()
        assert release.wait(WAIT_S)

    model = ModeledModel(SOURCE.config, StepTimeModel(load_profile("h100-llama3-8b").figures), speedup=1.0,
                         sleep=forward_wait)
    engine = Engine(model, EngineConfig(block_size=BS, model_id="modeled",
                                        memory=MemoryConfig(num_gpu_blocks=64)))

    async def scenario() -> None:
        runner = EngineRunner(engine)
        queue = await runner.submit(Request(RequestId("r"), prompt(1, 40), SamplingParams(max_tokens=2, ignore_eos=True)))
        assert await asyncio.to_thread(in_forward.wait, WAIT_S)
        # The step is inside its forward: a short job takes the pool now (it reads and pins nothing
        # the forward touches) while an ordinary call waits for the step to end.
        ordinary = asyncio.create_task(runner.call(lambda: release.is_set()))
        thread, free = await asyncio.wait_for(runner.call_short(
            lambda: (threading.current_thread().name, engine.memory.block_counts(Tier.GPU).free)), WAIT_S)
        assert thread.startswith("engine-short") and free < 64 and not release.is_set()
        release.set()
        assert await ordinary  # it ran after the step let the forward end
        while not isinstance(item := await queue.get(), Finished):
            assert not isinstance(item, BaseException)
        await runner.call(engine.check_invariants)
        await runner.close()

    asyncio.run(scenario())
