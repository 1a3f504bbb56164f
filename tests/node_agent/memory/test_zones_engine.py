"""Zones inside the engine: every zone and the physical layer are exported (valid Prometheus text that
follows our conventions), the weights zone holds the model's bytes, a step's activation peak is
measured, and the zone policies never change greedy output."""

import os
import re
import shutil
import subprocess
import sys

import pytest
from prometheus_client.parser import text_string_to_metric_families

from radixmesh.node_agent.engine.config import EngineConfig
from radixmesh.node_agent.engine.engine import Engine
from radixmesh.node_agent.engine.request import Request, RequestId
from radixmesh.node_agent.memory.config import MemoryConfig
from radixmesh.node_agent.memory.zones.budget import ZONES, ZoneName
from radixmesh.node_agent.memory.zones.governor import ZoneSetup
from radixmesh.node_agent.model.llama import LlamaForCausalLM
from radixmesh.proto.serve.sampling import SamplingParams
from tests.node_agent.test_gaie_metrics import COLON_LINTS
from tests.support.tiny_model import tiny_model


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    return tiny_model(seed=0)


def requests() -> list[Request]:
    shared = list(range(1, 41))
    return [Request(RequestId(f"r{i}"), tuple(shared + [50 + i] * (3 + i)), SamplingParams(max_tokens=12,
                                                                                          ignore_eos=True))
            for i in range(6)]


def engine(model: LlamaForCausalLM, policy: str = "shared", blocks: int = 64) -> Engine:
    memory = MemoryConfig(num_gpu_blocks=blocks, zones=ZoneSetup(policy=policy, kv_fraction=0.6))
    return Engine(model, EngineConfig(block_size=8, max_num_batched_tokens=256, memory=memory))


def test_every_zone_and_the_physical_layer_are_exported(model: LlamaForCausalLM) -> None:
    eng = engine(model)
    eng.generate(requests())
    families = {f.name: f for f in text_string_to_metric_families(eng.prometheus_text())}
    zones = {s.labels["zone"] for s in families["radixmesh_zone_watermark"].samples}
    assert zones == {z.value for z in ZONES}
    used = {s.labels["zone"]: s.value for s in families["radixmesh_zone_used_bytes"].samples}
    assert used["weights"] == sum(p.numel() * p.element_size() for p in model.parameters())
    [resident] = families["radixmesh_process_resident_bytes"].samples
    assert resident.value > 0
    for name in ("radixmesh_zone_borrows", "radixmesh_gc_auto_runs", "radixmesh_device_memory_free_bytes",
                 "radixmesh_activation_peak_bytes", "radixmesh_gc_trigger_free_run_bytes"):
        assert name in families, name


def test_exposition_follows_conventions_and_promtool(model: LlamaForCausalLM) -> None:
    eng = engine(model)
    eng.generate(requests()[:2])
    text = eng.prometheus_text()
    for f in text_string_to_metric_families(text):
        if re.search(r"\bbytes\b", f.documentation, re.IGNORECASE):
            assert f.name.endswith("_bytes"), f.name
        if re.search(r"\b(seconds?|times?|latency|duration)\b", f.documentation, re.IGNORECASE):
            assert f.name.endswith("_seconds"), f.name
    exe = shutil.which("promtool")
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("CI is set but promtool is not on PATH")
        return  # the conventions above are checked either way
    run = subprocess.run([exe, "check", "metrics"], input=text, check=False, capture_output=True, text=True,
                         timeout=60)
    # Only the colon of the vLLM names GAIE's endpoint pickers read; every radixmesh_ family is clean.
    assert set((run.stdout + run.stderr).splitlines()) <= COLON_LINTS, run.stdout + run.stderr


METER_PROBE = """
import torch
from radixmesh.node_agent.memory.physical import StepPeakMeter
meter = StepPeakMeter(torch.device("cpu"))
meter.start()
x = torch.ones(16 << 20)  # 64 MiB, touched, then freed before stop()
del x
print(meter.stop())
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux /proc")
def test_step_peak_meter_sees_a_transient_allocation() -> None:
    # In a process of its own: the CPU peak is the process's resident set, which other threads of a
    # long-lived test process (Ray, gRPC, an earlier module's garbage) can shrink meanwhile.
    done = subprocess.run([sys.executable, "-c", METER_PROBE], capture_output=True, text=True, timeout=120, check=True)
    assert int(done.stdout.split()[-1]) >= 48 << 20


@pytest.mark.parametrize("policy", ["fixed", "borrow"])
def test_zone_policies_keep_greedy_output(model: LlamaForCausalLM, policy: str) -> None:
    want = [o.output_token_ids for o in engine(model, "shared", blocks=24).generate(requests())]
    eng = engine(model, policy, blocks=24)  # small: the caps bind, so sequences wait or are preempted
    got = [o.output_token_ids for o in eng.generate(requests())]
    assert got == want
    eng.memory.zones.budget.check_invariants()
    eng.check_invariants()
    kv, prefix = eng.memory.gpu.pool.zone_limits  # the caps the zones set on the live pool: no door tells
    assert kv is not None and prefix is not None and kv + prefix == 24
    assert eng.memory.zones.budget[ZoneName.KV].base == int(24 * 0.6) * eng.layout.block_bytes
