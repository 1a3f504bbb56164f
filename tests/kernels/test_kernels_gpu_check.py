"""bench/gpu_check.py as far as a CPU can check it: arguments, shape tables, memory plan, no-CUDA exit."""

import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.support.bench_scripts import BENCH, load_bench

SCRIPT = BENCH / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check() -> ModuleType:
    return load_bench("gpu_check")


def test_arguments_default_to_the_committed_result_path(gpu_check: ModuleType) -> None:
    args = gpu_check.parse_args([])
    assert args.out == SCRIPT.parent / "results" / "gpu_check.json" and not args.quick
    assert gpu_check.parse_args(["--quick", "--seed", "3"]).seed == 3


def test_shapes_are_llama3_8b_and_span_the_issue_ranges(gpu_check: ModuleType) -> None:
    shape = gpu_check.LLAMA3_8B
    assert (shape.heads, shape.kv_heads, shape.head_dim, shape.block_size) == (32, 8, 128, 16)
    cases = gpu_check.DECODE_CHECKS + gpu_check.DECODE_BENCH
    assert {b for b, _ in cases} >= {1, 256} and all(1 <= b <= 256 for b, _ in cases)
    assert {c for _, c in cases} >= {512, 32768} and all(512 <= c <= 32768 for _, c in cases)
    # Uniform timing contexts must fill whole blocks: the dense SDPA copy is cut from block rows.
    assert all(c % shape.block_size == 0 for _, c in gpu_check.DECODE_BENCH)
    assert all(p % shape.block_size == 0 for _, p, _ in gpu_check.PREFILL_BENCH)


def test_memory_plan_fits_an_h200_with_headroom(gpu_check: ModuleType) -> None:
    planned = gpu_check.planned_bytes()
    assert 8 * gpu_check.GIB < planned < 100 * gpu_check.GIB


@pytest.mark.slow
def test_without_cuda_it_exits_2_with_a_clear_message() -> None:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick"], check=False, capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "needs a CUDA device" in proc.stderr


@pytest.mark.slow
def test_the_cluster_check_serves_identical_tokens_through_a_pull_on_this_machine(tmp_path: Path) -> None:
    """gpu_check's cluster part (bench/gpu_cluster.py) end to end on the CPU, with the tiny model:
    two agent actors, an uncached, a local and a pulled serve of each prompt, baselines measured."""
    out = tmp_path / "cluster.json"
    cluster = BENCH / "gpu_cluster.py"
    proc = subprocess.run([sys.executable, str(cluster), "--model", "tiny", "--trials", "2", "--prefix-tokens", "128",
                           "--decode-tokens", "16", "--out", str(out)], check=False, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    assert result["outputs_identical"] and result["pulls_failed"] == 0 and result["device"] == "cpu"
    assert all(r["pull_bytes"] > 0 for r in result["rows"])  # the pulled serve really pulled
    assert result["copy_gbps"] > 0 and result["pull_over_copy"] > 0 and result["decode_tokens_per_s"] > 0
    assert result["ttft_local_over_uncached"] > 0
