"""`radixmesh replay` survives admission control: a 429 is counted as refused (the report says how
many), or with retry_refused sent again after the router's Retry-After, instead of ending the replay
with openai.RateLimitError (issue 26)."""

from collections.abc import AsyncIterator

import pytest

from radixmesh.cluster.api.app import start_http
from radixmesh.cluster.cli.replay import format_report
from radixmesh.cluster.router.admission import AdmissionLimits
from radixmesh.cluster.sim.trace import TraceRequest
from radixmesh.cluster.sim.trace_replay import ReplayConfig, replay
from tests.support.router_cluster import BS, MODEL_NAME, local_cluster

pytestmark = pytest.mark.anyio

# Eight requests at once, distinct prompts, against one slot and no waiting line: most are refused.
BURST = [TraceRequest(0.0, 512 * 3, 2, (10 * i, 10 * i + 1, 10 * i + 2)) for i in range(8)]


@pytest.fixture
async def one_slot() -> AsyncIterator[str]:
    limits = AdmissionLimits(max_running_per_node=1, max_waiting=0, retry_after_s=0.05)
    async with local_cluster(1, admission=limits) as cluster:
        runner, port = await start_http(cluster.router, "127.0.0.1", 0)
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            await runner.cleanup()


async def test_refused_requests_are_counted_not_fatal(one_slot: str) -> None:
    done: list[None] = []
    report = await replay(one_slot, BURST, ReplayConfig(block_size=BS, model=MODEL_NAME, max_tokens=2),
                          on_done=lambda: done.append(None))
    assert 0 < report.refused < len(BURST) and report.retried == 0
    assert report.requests == len(BURST) == len(done)
    served = report.requests - report.refused
    assert report.prompt_tokens == served * 3 * BS  # only the served ones reached an agent
    assert f"refused (HTTP 429) {report.refused} of {len(BURST)} requests" in format_report(report)


@pytest.mark.slow
async def test_retry_refused_sends_them_again_until_served(one_slot: str) -> None:
    config = ReplayConfig(block_size=BS, model=MODEL_NAME, max_tokens=2, retry_refused=True, max_retries=200)
    report = await replay(one_slot, BURST, config)
    assert report.refused == 0 and report.retried > 0
    assert report.prompt_tokens == len(BURST) * 3 * BS
    assert "after" in format_report(report) and report.as_dict()["retried"] == report.retried


async def test_retries_run_out_and_the_request_counts_as_refused(one_slot: str) -> None:
    config = ReplayConfig(block_size=BS, model=MODEL_NAME, max_tokens=2, retry_refused=True, max_retries=0)
    report = await replay(one_slot, BURST, config)
    assert report.refused > 0 and report.retried == 0
