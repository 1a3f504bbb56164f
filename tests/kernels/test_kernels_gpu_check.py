"""bench/gpu_check.py as far as a CPU can check it: arguments and budgets, how a step's end is read, the
kernel and engine plans, greedy agreement, the step log, the carried wheels, the no-CUDA exit, a step
stopped at its budget. tests/kernels/test_gpu_check_box.py runs it on a box as bare as a lent GPU's."""

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from types import ModuleType

import pytest
import torch

from radixmesh.node_agent.engine.request import RequestId, RequestOutput, RequestStats
from radixmesh.node_agent.model.config import named_config
from radixmesh.proto.serve.sampling import FinishReason
from tests.support.bench_scripts import BENCH, load_bench

SCRIPT = BENCH / "gpu_check.py"
GIB = 1 << 30


@pytest.fixture(scope="module")
def gpu_check() -> ModuleType:
    return load_bench("gpu_check")  # puts bench/ on sys.path, where its siblings below import each other


@pytest.fixture(scope="module")
def gpu_kernels(gpu_check: ModuleType) -> ModuleType:
    return load_bench("gpu_kernels")


@pytest.fixture(scope="module")
def gpu_engine(gpu_check: ModuleType) -> ModuleType:
    return load_bench("gpu_engine")


def test_arguments_default_to_the_results_folder_and_every_step(gpu_check: ModuleType) -> None:
    args = gpu_check.parse_args([])
    assert args.out == BENCH / "results" and not args.quick and not args.smoke
    assert args.steps == ["kernels", "engine", "cluster"]
    assert sum(args.budgets.values()) <= 8 * 60  # the whole check fits one device call with room to rerun
    assert gpu_check.parse_args(["--quick", "--seed", "3", "--steps", "engine"]).steps == ["engine"]


def test_a_budget_is_set_for_every_step_or_for_one(gpu_check: ModuleType) -> None:
    assert gpu_check.parse_budgets(["60", "engine=300"]) == {"kernels": 60, "engine": 300, "cluster": 60}
    with pytest.raises(ValueError, match="unknown step 'kernel'"):
        gpu_check.parse_budgets(["kernel=5"])
    with pytest.raises(ValueError, match="not a number"):
        gpu_check.parse_budgets(["engine=soon"])
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--steps", "kernels,nope"])


def test_a_step_ends_as_its_exit_code_and_its_file_say(gpu_check: ModuleType) -> None:
    def written(status: str, correct: bool = True) -> dict[str, object]:
        return {"status": status, "correct": correct}

    conclude = gpu_check.conclude
    assert conclude(0, written("ok")) == "ok"
    assert conclude(0, written("ok", correct=False)) == "failed"
    assert conclude(0, written("skipped")) == "skipped"
    assert conclude(None, written("running")) == "timeout"
    assert conclude(1, written("running")) == "error"  # an uncaught exception
    assert conclude(0, written("running")) == "error"  # exited without finishing its log


def test_kernel_shapes_are_llama3_8b_and_span_the_issue_ranges(gpu_kernels: ModuleType) -> None:
    plan = gpu_kernels.GPU_PLAN
    shape = plan.shape
    assert (shape.heads, shape.kv_heads, shape.head_dim, shape.block_size) == (32, 8, 128, 16)
    assert plan.dtype == torch.bfloat16
    cases = plan.decode_checks + plan.decode_bench
    assert {b for b, _ in cases} >= {1, 256} and all(1 <= b <= 256 for b, _ in cases)
    assert {c for _, c in cases} >= {512, 32768} and all(512 <= c <= 32768 for _, c in cases)
    # Uniform timing contexts must fill whole blocks: the dense SDPA copy is cut from block rows.
    assert all(c % shape.block_size == 0 for _, c in plan.decode_bench)
    assert all(p % shape.block_size == 0 for _, p, _ in plan.prefill_bench)
    assert plan.quick().decode_checks == plan.decode_checks and len(plan.quick().decode_bench) == 3


def test_kernel_memory_plan_fits_an_h200_with_headroom(gpu_kernels: ModuleType) -> None:
    assert 8 * GIB < gpu_kernels.planned_bytes(gpu_kernels.GPU_PLAN) < 100 * GIB


def test_engine_plan_is_llama3_8b_in_bf16_and_fits_an_h200(gpu_engine: ModuleType) -> None:
    plan = gpu_engine.GPU_PLAN
    c = named_config(plan.model)
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
            c.intermediate_size, c.vocab_size) == (4096, 32, 32, 8, 128, 14336, 128256)
    assert plan.dtype == torch.bfloat16 and plan.decode_batches == (1, 16, 64) and plan.ttft_prompts == (1024, 4096)
    attention = 2 * c.hidden_size * c.head_dim * (c.num_attention_heads + c.num_key_value_heads)  # q, k, v, o
    layer = attention + 3 * c.hidden_size * c.intermediate_size
    weights = 2 * (c.num_hidden_layers * layer + 2 * c.vocab_size * c.hidden_size)  # bf16, untied head
    block = c.num_hidden_layers * 2 * 16 * c.num_key_value_heads * c.head_dim * 2
    assert 14 * GIB < weights < 16 * GIB and weights + plan.num_blocks * block < 100 * GIB
    # Every decode request of the largest batch holds its blocks at once; the longest prompt fits the context.
    per_request = -(-(plan.decode_prompt + plan.decode_steps + 64) // 16)
    assert max(plan.decode_batches) * per_request <= plan.num_blocks
    assert max(plan.ttft_prompts) + plan.greedy_tokens <= c.max_position_embeddings


def _output(tokens: list[int], logits: list[list[float]]) -> RequestOutput:
    return RequestOutput(RequestId("r"), (1,), tuple(tokens), FinishReason.LENGTH, RequestStats(1, 0.0),
                         logits=tuple(torch.tensor(row) for row in logits))


def test_greedy_outputs_agree_when_identical_or_split_by_a_near_tie(gpu_engine: ModuleType) -> None:
    cold = _output([0, 1], [[2.0, 1.0, 0.0], [0.0, 1.0, 0.98]])
    same = gpu_engine.agreement(cold, _output([0, 1], [[2.0, 1.0, 0.0], [0.0, 1.0, 0.98]]))
    assert same == (True, None, 0.0, None) and same.within(1e-3)
    tie = gpu_engine.agreement(cold, _output([0, 2], [[2.0, 1.0, 0.01], [0.0, 0.99, 1.0]]))
    assert not tie.identical and tie.first_divergence == 1 and tie.margin == pytest.approx(0.02)
    assert tie.within(0.05) and not tie.within(0.015)
    wrong = gpu_engine.agreement(cold, _output([1, 1], [[0.0, 2.0, 0.0], [0.0, 1.0, 0.0]]))
    assert wrong.first_divergence == 0 and wrong.max_logit_diff == 2.0 and not wrong.within(0.5)


def test_a_step_log_leaves_its_rows_after_every_record(gpu_check: ModuleType, tmp_path: Path) -> None:
    StepLog, read_step = gpu_check.StepLog, gpu_check.read_step  # bench/gpu_step.py, as gpu_check imports it
    path = tmp_path / "kernels.json"
    assert read_step(path) is None
    log = StepLog(path)
    log.record("write_kv", True, tokens=4)
    assert read_step(path) == {"status": "running", "reason": None, "correct": True, "summary": {},
                               "rows": [{"kind": "write_kv", "ok": True, "tokens": 4}]}
    log.record("gather", False, blocks=2)
    log.finish(goals={})
    assert read_step(path) == {**log.as_dict(), "status": "ok", "correct": False}


def test_wheels_unpack_into_a_folder_python_imports_from(gpu_check: ModuleType, tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "carried_mod-1.2-py3-none-any.whl", "w") as z:
        z.writestr("carried_mod/__init__.py", "VALUE = 7\n")
    assert gpu_check.gpu_wheels.unpack(wheels, tmp_path / "site") == {"carried_mod": "1.2"}
    run = subprocess.run([sys.executable, "-c", "import carried_mod; print(carried_mod.VALUE)"],
                         env={**os.environ, "PYTHONPATH": str(tmp_path / "site")}, capture_output=True, text=True,
                         check=True)
    assert run.stdout.strip() == "7"
    with pytest.raises(ValueError, match="no wheels"):
        gpu_check.gpu_wheels.unpack(tmp_path / "site", tmp_path / "elsewhere")


def test_a_wheels_folder_without_wheels_is_refused_before_anything_runs(gpu_check: ModuleType,
                                                                       tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--wheels", str(tmp_path)])


def test_the_wheels_fetched_are_binary_pinned_to_this_checkouts_versions(gpu_check: ModuleType) -> None:
    from importlib.metadata import version

    cmd = gpu_check.gpu_wheels.fetch_command(Path("w"))
    assert cmd[1:4] == ["-m", "pip", "download"] and {"--no-deps", "--only-binary=:all:"} <= set(cmd)
    assert set(cmd[-4:]) == {f"{d}=={version(d)}" for d in ("prometheus_client", "tokenizers", "gguf", "PyYAML")}


@pytest.mark.slow
def test_without_cuda_it_exits_2_with_a_clear_message() -> None:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick"], check=False, capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "needs a CUDA device" in proc.stderr and "--smoke" in proc.stderr


@pytest.mark.slow
def test_a_step_past_its_budget_is_stopped_recorded_and_the_next_one_runs(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--steps", "kernels,engine", "--budget-s", "0.5",
                           "--out", str(tmp_path)], check=False, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    assert result["smoke"] and not result["complete"] and result["correct"]
    for step in result["steps"].values():
        assert step["status"] == "timeout" and step["budget_s"] == 0.5 and step["wall_s"] < 5, step
