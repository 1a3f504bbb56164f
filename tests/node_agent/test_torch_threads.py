"""How many threads an agent's torch computes with: the CPUs its Ray actor was given."""

import logging
import os

import pytest
import torch

from radixmesh.node_agent.agent import NodeAgent
from radixmesh.node_agent.placement import ray_assigned_cpus, set_torch_threads, torch_threads
from tests.support.agents import agent_config


@pytest.mark.parametrize(("assigned", "affinity", "current", "want"), [
    (4.0, 16, 1, 4),  # a Ray actor: the CPUs Ray assigned, whatever the process had
    (3.6, 16, 1, 4),  # rounded
    (0.4, 16, 8, 1),  # at least one
    (0.0, 16, 8, 1),  # an actor that asked for no CPU still computes
    (8.0, 2, 1, 2),  # never more than the CPUs the process may run on
    (None, 16, 1, 1),  # outside Ray: the embedding process's choice (tests pin one thread)
    (None, 2, 8, 2),  # ... capped by the affinity
])
def test_threads_follow_ray_cpus_within_the_affinity(assigned: float | None, affinity: int, current: int,
                                                     want: int) -> None:
    assert torch_threads(assigned, affinity, current) == want


def test_outside_ray_the_process_keeps_its_threads() -> None:
    before = torch.get_num_threads()
    assert ray_assigned_cpus() is None
    try:
        assert set_torch_threads() == min(before, len(os.sched_getaffinity(0)))
        assert torch.get_num_threads() == min(before, len(os.sched_getaffinity(0)))
    finally:
        torch.set_num_threads(before)


@pytest.mark.anyio
async def test_the_agent_states_its_torch_threads_in_its_start_up_line(caplog: pytest.LogCaptureFixture) -> None:
    agent = NodeAgent(agent_config("a"))
    with caplog.at_level(logging.INFO, logger="radixmesh.node_agent.agent"):
        await agent.start()
    try:
        up = [r.getMessage() for r in caplog.records if " up: " in r.getMessage()]
        assert len(up) == 1 and f"(torch threads {torch.get_num_threads()})" in up[0], up
    finally:
        await agent.stop()
