"""The measured GPU profile (profiles/h200-llama3-8b-radixmesh.yaml) against the GPU check's JSON it was
fitted to (bench/results/gpu_check.json): every engine timing there, re-derived from the profile's
figures by the time model, within 30% (the profile's comment lists each error and why the warm serves
are the farthest)."""

import json
import statistics
from pathlib import Path

import pytest

from radixmesh.node_agent.model.modeled.profile import load_profile
from radixmesh.node_agent.model.modeled.time_model import PrefillChunk, StepTimeModel

GPU_CHECK = Path(__file__).parents[3] / "bench" / "results" / "gpu_check.json"
CHUNK = 2048  # bench/gpu_engine.py GPU_PLAN.max_num_batched_tokens
DECODE_CONTEXT = 176  # GPU_PLAN's 128-token prompts, timed over their 33rd-64th generated tokens


def _engine_rows() -> list[dict[str, object]]:
    doc = json.loads(GPU_CHECK.read_text())
    assert not doc["smoke"] and doc["device"].startswith("NVIDIA H200")
    return doc["steps"]["engine"]["rows"]


def _timings() -> list[tuple[str, float, float]]:
    """(label, measured seconds, the profile's seconds) for every engine timing of the GPU check."""
    model = StepTimeModel(load_profile("h200-llama3-8b-radixmesh").figures)
    rows = _engine_rows()
    out = [(f"decode b{r['batch']}", float(r["step_ms"]) / 1e3,  # type: ignore[arg-type]
            model.step_s([], [DECODE_CONTEXT] * int(r["batch"])))  # type: ignore[call-overload]
           for r in rows if r["kind"] == "decode"]
    for n in sorted({int(r["prompt"]) for r in rows if r["kind"] == "ttft"}):  # type: ignore[call-overload]
        trials = [r for r in rows if r["kind"] == "ttft" and r["prompt"] == n]
        cold = sum(model.prefill_s(min(CHUNK, n - c), c) for c in range(0, n, CHUNK))
        warm_hit = int(trials[0]["warm_hit"])  # type: ignore[call-overload]
        out.append((f"cold {n}", statistics.median(float(r["cold_s"]) for r in trials), cold))  # type: ignore[arg-type]
        out.append((f"warm {n}", statistics.median(float(r["warm_s"]) for r in trials),  # type: ignore[arg-type]
                    model.step_s([PrefillChunk(n - warm_hit, warm_hit)], [])))
    return out


def test_the_gpu_check_measured_an_h200_and_every_engine_check_held() -> None:
    doc = json.loads(GPU_CHECK.read_text())
    assert doc["correct"] and doc["steps"]["engine"]["status"] == "ok"
    assert {r["kind"] for r in _engine_rows()} == {"decode", "ttft"}


@pytest.mark.parametrize("index", range(7))
def test_the_measured_profile_reproduces_each_gpu_timing_within_30_percent(index: int) -> None:
    timings = _timings()
    assert len(timings) == 7  # decode at 3 batches, cold and warm TTFT at 2 lengths
    label, measured, modeled = timings[index]
    assert abs(modeled / measured - 1) <= 0.30, f"{label}: modeled {modeled * 1e3:.1f} ms, measured {measured * 1e3:.1f} ms"
