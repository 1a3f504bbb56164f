"""Bench workloads as Mooncake traces: block ids name exactly the shared prefix, lines follow the bench's
schedule, the CLI writes what the simulator reads, and the committed traces are what their README
commands regenerate."""

import itertools
import math
import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from radixmesh.cluster.bench.schedule import open_loop
from radixmesh.cluster.bench.sim_trace import BlockIds, trace_lines
from radixmesh.cluster.bench.workloads import AgentWorkload, ChatWorkload
from radixmesh.cluster.cli.main import main
from radixmesh.cluster.sim.trace import read_trace

TRACES = Path(__file__).resolve().parents[2] / "data" / "traces"
SMALL_CHAT = ChatWorkload(system_tokens=20, user_tokens=(4, 8), reply_tokens=(4, 8), think_median_s=2.0)


def test_a_shared_prefix_gives_shared_leading_ids_and_only_those() -> None:
    blocks = BlockIds(block_tokens=4)
    a = tuple(range(10))  # |0 1 2 3|4 5 6 7|8 9|
    assert blocks.ids(a) == [0, 1, 2]
    assert blocks.ids(a[:8] + (99, 98)) == [0, 1, 3]  # same two blocks, another tail
    assert blocks.ids((0, 1, 2, 3, 4, 5, 6, 99)) == [0, 4]  # block 1 differs in its last token
    assert blocks.ids((7, 1, 2, 3, 4, 5, 6, 7)) == [5, 6]  # block 0 differs: nothing after it is shared
    assert blocks.ids(a) == [0, 1, 2]  # an equal prompt, equal ids


def test_the_partial_last_block_is_a_block_of_its_own_unlike_a_longer_one() -> None:
    blocks = BlockIds(block_tokens=4)
    assert blocks.ids((0, 1, 2, 3, 4, 5)) == [0, 1]  # |0 1 2 3|4 5|
    assert blocks.ids((0, 1, 2, 3, 4, 5, 6, 7)) == [0, 2]  # |4 5 6 7| is not the tail |4 5|
    assert blocks.ids((0, 1, 2, 3)) == [0]  # a whole number of blocks adds no empty tail
    assert blocks.ids((0, 1)) == [3]  # a tail-only prompt is not block 0


@given(prompts=st.lists(st.lists(st.integers(0, 1), min_size=1, max_size=12).map(tuple), max_size=8),
       block_tokens=st.integers(1, 5))
def test_ids_match_an_oracle_that_numbers_every_prefix_up_to_a_block_end(
        prompts: list[tuple[int, ...]], block_tokens: int) -> None:
    blocks = BlockIds(block_tokens)
    oracle: dict[tuple[int, ...], int] = {}
    for p in prompts:
        ends = [min(len(p), k * block_tokens) for k in range(1, math.ceil(len(p) / block_tokens) + 1)]
        assert blocks.ids(p) == [oracle.setdefault(p[:end], len(oracle)) for end in ends]


def test_block_tokens_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="block_tokens"):
        BlockIds(block_tokens=0)


def test_a_chat_whose_first_turn_can_never_fit_is_refused_not_generated_forever() -> None:
    with pytest.raises(ValueError, match="max_prompt_tokens"):
        ChatWorkload(system_tokens=1990, user_tokens=(8, 16), max_tokens=8)
    ChatWorkload(system_tokens=1984, user_tokens=(8, 16), max_tokens=8)  # exactly fits: some sessions exist


def test_trace_lines_are_the_bench_requests_with_dense_ids_in_arrival_order() -> None:
    workload = AgentWorkload(preamble_tokens=40, task_tokens=(4, 8), call_tokens=(2, 4), result_tokens=(4, 8))
    lines = list(trace_lines(workload, 3.0, 120, seed=5, block_tokens=16))
    requests = list(itertools.islice(open_loop(workload, 3.0, seed=5), 120))
    assert len(lines) == 120
    assert [line["timestamp"] for line in lines] == [round(r.arrival_s * 1000) for r in requests]
    assert [line["input_length"] for line in lines] == [len(r.prompt) for r in requests]
    assert {line["output_length"] for line in lines} == {workload.max_tokens}
    stamps = [line["timestamp"] for line in lines]
    assert stamps == sorted(stamps)
    ids = [h for line in lines for h in line["hash_ids"]]
    assert list(dict.fromkeys(ids)) == list(range(len(set(ids))))  # dense, numbered as first seen
    assert lines[0]["hash_ids"][:2] == lines[1]["hash_ids"][:2] == [0, 1]  # the shared 40-token preamble


def test_trace_lines_refuse_a_bad_rate_or_count_before_generating() -> None:
    with pytest.raises(ValueError, match="rate"):
        trace_lines(SMALL_CHAT, 0.0, 10, seed=0)
    with pytest.raises(ValueError, match="requests"):
        trace_lines(SMALL_CHAT, 1.0, -1, seed=0)


def test_the_cli_writes_a_trace_the_simulator_reads(tmp_path: Path) -> None:
    out = tmp_path / "chat.jsonl"
    result = CliRunner().invoke(main, ["bench-trace", "chat", "--requests", "40", "--rate", "2", "--seed", "3",
                                       "--scale", "8", "--set", "turns=2,4", "--set", "max_prompt_tokens=16000",
                                       "-o", str(out)])
    assert result.exit_code == 0, result.output
    trace = read_trace(out)
    assert len(trace) == 40
    # system prompts of 512 * 8 tokens: 8 whole blocks, shared, then the turns
    assert trace[0].hash_ids[:8] == tuple(range(8)) and trace[0].input_length > 8 * 512


@pytest.mark.parametrize("args", [
    ["chat", "--rate", "0"],
    ["chat", "--requests", "0"],
    ["chat", "--set", "turns"],
    ["chat", "--set", "colour=red"],
    ["chat", "--set", "turns=2"],
    ["chat", "--set", "think_median_s=soon"],
    ["chat", "--set", "turns=6,2"],  # a range high before low fails in the generator
    ["chat", "--scale", "4"],  # 2,048-token system prompts past the default 2,000-token context
    ["essay"],
], ids=["rate", "requests", "no-value", "unknown-field", "short-range", "not-a-number", "range-order",
        "past-context", "workload"])
def test_bad_arguments_are_a_usage_error_and_write_nothing(tmp_path: Path, args: list[str]) -> None:
    out = tmp_path / "t.jsonl"
    result = CliRunner().invoke(main, ["bench-trace", *args, "-o", str(out)])
    assert result.exit_code == 2, result.output
    assert not out.exists()


def _readme_commands() -> dict[str, list[str]]:
    """The committed trace each README `radixmesh bench-trace` command writes, and its arguments."""
    commands = re.findall(r"^ {4}radixmesh (bench-trace .*)$", (TRACES / "README.md").read_text(), re.MULTILINE)
    out: dict[str, list[str]] = {}
    for line in commands:
        args = shlex.split(line)
        out[Path(args[args.index("-o") + 1]).name] = args
    return out


def test_the_readme_regenerates_each_generated_trace() -> None:
    assert set(_readme_commands()) == {"chat.jsonl", "chat_b.jsonl", "docs.jsonl", "agent.jsonl"}


@pytest.mark.parametrize("name", ["chat.jsonl", "chat_b.jsonl", "docs.jsonl", "agent.jsonl"])
def test_a_committed_trace_is_what_its_readme_command_writes(tmp_path: Path, name: str) -> None:
    args = _readme_commands()[name]
    args[args.index("-o") + 1] = str(tmp_path / name)
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert (tmp_path / name).read_bytes() == (TRACES / name).read_bytes()
