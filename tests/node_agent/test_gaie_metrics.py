"""The Gateway API Inference Extension's model-server metrics (what llm-d's and AIBrix's endpoint
pickers scrape, by vLLM's names) and the per-agent latency histograms, with the protocol's semantics:
`vllm:num_requests_waiting` counts requests queued and not scheduled (new, pulling their prefix or
preempted), `vllm:num_requests_running` the scheduled ones, `vllm:kv_cache_usage_perc` gpu blocks
referenced by requests over all gpu blocks (cached blocks nobody holds are free), one series each,
labelled `model_name`. Every agent serves them on its own /metrics, and promtool finds nothing there
but the colon of vLLM's names."""

import os
import shutil
from dataclasses import replace
from pathlib import Path

import aiohttp
import anyio
import pytest
from prometheus_client.parser import text_string_to_metric_families

from radixmesh.cluster.fleet.ingest.engine_metrics import EngineMetrics, parse_engine_metrics
from radixmesh.node_agent.agent import NodeAgent
from radixmesh.node_agent.engine.config import EngineConfig
from radixmesh.node_agent.engine.engine import Engine
from radixmesh.node_agent.memory.config import MemoryConfig
from radixmesh.node_agent.memory.sequence import PendingPrefix
from radixmesh.proto.events import Tier
from radixmesh.proto.serve.plan import ServePlan, ServeResult
from radixmesh.proto.serve.sampling import SamplingParams
from tests.node_agent.engine.test_scheduler import BS, MODEL, req
from tests.support.router_cluster import agent_config
from tests.support.tiny_model import MODEL_NAME

GAIE = {"vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc"}
COLON_LINTS = {f"{name} metric names should not contain ':'" for name in GAIE}
"""All `promtool check metrics` says of an agent's scrape: the vLLM names the endpoint pickers read by
default keep vLLM's colon, which promtool's linter reserves for recording rules (vLLM's own /metrics
draws the same lines); every radixmesh_ family is clean."""
LABELS = {"model_name": "m"}
GPU_BLOCKS = 16


class Clock:
    """Set by the test; constant within an engine step, so every latency is a whole number of steps."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def engine(clock: Clock, max_num_seqs: int = 8) -> Engine:
    return Engine(MODEL, EngineConfig(block_size=BS, max_num_batched_tokens=64, max_num_seqs=max_num_seqs,
                                      memory=MemoryConfig(num_gpu_blocks=GPU_BLOCKS)), clock=clock)


def scrape(eng: Engine) -> dict[str, float]:
    """The GAIE gauges of one exposition, asserting each is one gauge series labelled model_name."""
    text = eng.prometheus_text(LABELS)
    families = {f.name: f for f in text_string_to_metric_families(text) if f.name in GAIE}
    assert families.keys() == GAIE
    values = {}
    for name, f in families.items():
        [sample] = f.samples  # an endpoint picker reads one series per family
        assert f.type == "gauge" and sample.labels.get("model_name") == "m", (name, f.type, sample.labels)
        values[name] = sample.value
    assert values["vllm:kv_cache_usage_perc"] == values["vllm:gpu_cache_usage_perc"]
    return values


def histogram(eng: Engine, name: str) -> tuple[float, float]:
    """(count, sum) of one histogram family, checking it carries model_name."""
    [f] = [f for f in text_string_to_metric_families(eng.prometheus_text(LABELS)) if f.name == name]
    assert f.type == "histogram" and all(s.labels.get("model_name") == "m" for s in f.samples)
    by_name = {s.name: s.value for s in f.samples}
    return by_name[f"{name}_count"], by_name[f"{name}_sum"]


def test_waiting_is_queued_running_is_scheduled_usage_is_referenced_blocks() -> None:
    clock = Clock()
    eng = engine(clock, max_num_seqs=2)
    for i in range(3):  # 6-token prompts: 2 blocks each while prefilling
        eng.submit(req(f"r{i}", [10 * i + j for j in range(6)], max_tokens=2))
    assert scrape(eng) == dict.fromkeys(GAIE, 0) | {"vllm:num_requests_waiting": 3}
    eng.step()  # two slots: r0 and r1 run, r2 waits
    used = 4 / GPU_BLOCKS
    assert scrape(eng) == {"vllm:num_requests_waiting": 1, "vllm:num_requests_running": 2,
                           "vllm:kv_cache_usage_perc": used, "vllm:gpu_cache_usage_perc": used}
    # What radixmesh reads from an external vLLM engine's /metrics, it reads from its own agent's.
    read = parse_engine_metrics(eng.prometheus_text(LABELS))
    assert read == EngineMetrics(waiting=1, running=2, kv_usage=used)
    while eng.has_work:
        eng.step()
    # Idle: the finished requests' blocks stay cached for reuse, but nobody holds them, so they are free.
    assert eng.memory.block_counts(Tier.GPU).cached > 0
    assert scrape(eng) == dict.fromkeys(GAIE, 0)


def test_a_request_pulling_its_prefix_waits_and_its_landing_blocks_are_used() -> None:
    eng = engine(Clock())
    pull = PendingPrefix(3)
    eng.submit(req("p", list(range(2, 16)), pending_prefix=pull))  # 14 tokens: 3 usable full blocks
    eng.step()  # passed over: not schedulable until its pull lands
    used = 3 / GPU_BLOCKS
    assert scrape(eng) == {"vllm:num_requests_waiting": 1, "vllm:num_requests_running": 0,
                           "vllm:kv_cache_usage_perc": used, "vllm:gpu_cache_usage_perc": used}
    eng.land_pull(pull, 0)  # nothing arrived: computed here instead
    eng.step()
    assert scrape(eng)["vllm:num_requests_running"] == 1


def test_preempted_requests_count_as_waiting() -> None:
    eng = Engine(MODEL, EngineConfig(block_size=BS, max_num_batched_tokens=64,
                                     memory=MemoryConfig(num_gpu_blocks=4, enable_prefix_caching=False)))
    for i in range(2):
        eng.submit(req(f"r{i}", [20 * i + j + 2 for j in range(8)], max_tokens=4))
    eng.step()  # both prefill their 2 blocks: the pool is full
    eng.step()  # r0's next token needs a third block: r1, admitted last, is preempted back to the queue
    assert sum(eng.scheduler.num_preemptions.values()) == 1
    values = scrape(eng)
    assert (values["vllm:num_requests_waiting"], values["vllm:num_requests_running"]) == (1, 1)


def test_time_to_first_token_is_a_histogram_from_arrival() -> None:
    clock = Clock()
    eng = engine(clock, max_num_seqs=2)
    for i in range(3):
        eng.submit(req(f"r{i}", [10 * i + j for j in range(6)], max_tokens=3))
    while eng.has_work:  # one second per step: r0, r1 first sample at t=1, r2 gets a slot at t=4
        clock.now += 1.0
        eng.step()
    assert histogram(eng, "radixmesh_time_to_first_token_seconds") == (3, 1 + 1 + 4)


def test_queue_time_and_inter_token_latency_are_histograms_per_request() -> None:
    clock = Clock()
    eng = engine(clock, max_num_seqs=2)
    for i in range(3):
        eng.submit(req(f"r{i}", [10 * i + j for j in range(6)], max_tokens=3))
    while eng.has_work:
        clock.now += 1.0
        eng.step()
    # r0, r1 scheduled at t=1 and r2 at t=4; 3 tokens each, one step (1 s) apart
    assert histogram(eng, "radixmesh_request_queue_time_seconds") == (3, 1 + 1 + 4)
    assert histogram(eng, "radixmesh_inter_token_latency_seconds") == (6, 6)


@pytest.fixture
def promtool() -> str:
    exe = shutil.which("promtool")
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("CI is set but promtool is not on PATH: .ci/run installs it (Debian's prometheus "
                        "package)")
        pytest.skip("promtool is not on PATH (it comes with Debian's `prometheus` package; CI installs it)")
    return exe


@pytest.mark.integration
@pytest.mark.anyio
async def test_every_agent_serves_the_gaie_names_and_promtool_finds_them_clean(promtool: str, tmp_path: Path
                                                                               ) -> None:
    agents = [NodeAgent(replace(agent_config(n), metrics_port=0)) for n in ("a", "b")]
    for a in agents:
        await a.start()
    try:
        sampling = SamplingParams(max_tokens=2, ignore_eos=True)
        texts = []
        async with aiohttp.ClientSession() as http:
            for a in agents:
                plan = ServePlan(f"q-{a.node}", tuple(range(2, 12)), sampling)
                items = [item async for item in a.serve(plan)]
                assert isinstance(items[-1], ServeResult)
                target = a.scrape_target()
                assert target is not None
                async with http.get(f"http://{target.address}/metrics") as r:
                    assert r.status == 200
                    texts.append(await r.text())
    finally:
        for a in agents:
            await a.stop()
    for text in texts:
        families = {f.name: f for f in text_string_to_metric_families(text)}
        for name in GAIE:
            [sample] = families[name].samples
            assert families[name].type == "gauge" and sample.labels["model_name"] == MODEL_NAME
            assert sample.value == 0  # served and idle again: nothing queued, running or held
        for name in ("radixmesh_time_to_first_token_seconds", "radixmesh_inter_token_latency_seconds",
                     "radixmesh_request_queue_time_seconds"):
            assert families[name].type == "histogram"
            assert {s.labels["model_name"] for s in families[name].samples} == {MODEL_NAME}
        [count] = [s.value for s in families["radixmesh_time_to_first_token_seconds"].samples
                   if s.name.endswith("_count")]
        assert count == 1
        path = tmp_path / "metrics.prom"
        path.write_text(text)
        with path.open() as f, anyio.fail_after(60):  # `promtool check metrics` reads the text on stdin
            run = await anyio.run_process([promtool, "check", "metrics"], stdin=f, check=False)
        assert set((run.stdout + run.stderr).decode().splitlines()) == COLON_LINTS
