"""The bench's workloads and arrivals: seeded (same seed, same requests), Poisson at the offered rate,
sessions that keep their think times and grow or share prefixes as their kind says."""

import dataclasses
import itertools
import random
import statistics
from dataclasses import replace
from pathlib import Path

import pytest

from radixmesh.cluster.bench.schedule import BenchRequest, Workload, poisson_times, schedule
from radixmesh.cluster.bench.workloads import (
    GENERATORS,
    AgentWorkload,
    ChatWorkload,
    ConvoWorkload,
    DocsWorkload,
    LongWorkload,
    TraceWorkload,
    workload_settings,
)
from radixmesh.cluster.cli.bench import chosen_workloads
from radixmesh.cluster.sim.trace import read_trace

TRACE = Path(__file__).resolve().parents[2] / "data" / "traces" / "mooncake_trace_1000.jsonl"
SMALL_CHAT = ChatWorkload(system_tokens=64, user_tokens=(4, 8), reply_tokens=(4, 8), think_median_s=2.0)


def test_poisson_times_have_the_offered_mean_rate_and_exponential_gaps() -> None:
    arrivals = list(itertools.takewhile(lambda t: t < 2000.0, poisson_times(5.0, random.Random(1))))
    # 10,000 expected, standard deviation 100: 4 sigma either way
    assert 9600 <= len(arrivals) <= 10400
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    assert statistics.fmean(gaps) == pytest.approx(0.2, rel=0.04)
    assert statistics.stdev(gaps) == pytest.approx(0.2, rel=0.06)  # exponential: sd = mean
    assert arrivals == sorted(arrivals) and 0 < arrivals[0] and arrivals[-1] < 2000.0


def test_poisson_times_reject_a_rate_of_zero() -> None:
    with pytest.raises(ValueError):
        next(poisson_times(0.0, random.Random(0)))


@pytest.mark.parametrize("workload", [SMALL_CHAT, DocsWorkload(document_tokens=64), AgentWorkload(preamble_tokens=64),
                                      LongWorkload(scale=1 / 32)],
                         ids=["chat", "docs", "agent", "long"])
def test_the_same_seed_gives_the_same_requests_and_another_seed_others(workload: Workload) -> None:
    a = schedule(workload, 4.0, 30.0, seed=3)
    assert a == schedule(workload, 4.0, 30.0, seed=3)
    assert a != schedule(workload, 4.0, 30.0, seed=4)
    assert [r.index for r in a] == list(range(len(a)))


def _sessions(requests: list[BenchRequest]) -> dict[int, list[BenchRequest]]:
    out: dict[int, list[BenchRequest]] = {}
    for r in requests:
        out.setdefault(r.session, []).append(r)
    return out


def test_chat_turns_keep_their_order_and_think_times_and_resend_the_conversation() -> None:
    requests = schedule(SMALL_CHAT, 3.0, 120.0, seed=0)
    sessions = _sessions(requests)
    assert any(len(turns) >= 3 for turns in sessions.values())
    for turns in sessions.values():
        assert [t.turn for t in turns] == list(range(len(turns)))
        for before, after in itertools.pairwise(turns):
            assert after.arrival_s - before.arrival_s >= SMALL_CHAT.think_bounds_s[0]
            assert after.prompt[: len(before.prompt)] == before.prompt  # the conversation so far, then more
            assert len(after.prompt) > len(before.prompt)
    systems = {r.prompt[:64] for r in requests}
    assert len(systems) == SMALL_CHAT.systems  # every conversation opens with one of the shared prompts


def test_a_higher_rate_sends_the_same_sessions_with_more_users_at_once() -> None:
    slow, fast = schedule(SMALL_CHAT, 1.0, 60.0, seed=0), schedule(SMALL_CHAT, 4.0, 60.0, seed=0)
    assert len(fast) > 2 * len(slow)
    assert _sessions(fast)[0][0].prompt == _sessions(slow)[0][0].prompt
    assert len(_sessions(fast)) > len(_sessions(slow))


def test_docs_questions_follow_one_of_the_documents_and_popular_ones_more_often() -> None:
    docs = DocsWorkload(documents=4, document_tokens=32, zipf_s=1.5)
    requests = schedule(docs, 5.0, 200.0, seed=0)
    counts: dict[tuple[int, ...], int] = {}
    for r in requests:
        counts[r.prompt[:32]] = counts.get(r.prompt[:32], 0) + 1
        assert 32 + 8 <= len(r.prompt) <= 32 + 32
    assert len(counts) == 4
    ranked = sorted(counts.values(), reverse=True)
    assert ranked[0] > 2 * ranked[-1]


def test_agent_calls_grow_one_run_over_a_shared_preamble() -> None:
    agent = AgentWorkload(toolsets=2, preamble_tokens=48)
    requests = schedule(agent, 5.0, 60.0, seed=0)
    assert len({r.prompt[:48] for r in requests}) == 2
    for turns in _sessions(requests).values():
        for before, after in itertools.pairwise(turns):
            assert after.prompt[: len(before.prompt)] == before.prompt
            assert len(after.prompt) + agent.max_tokens <= agent.max_prompt_tokens


def test_a_prompt_scale_shrinks_every_generated_length() -> None:
    full = schedule(SMALL_CHAT, 2.0, 30.0, seed=0)
    half = schedule(replace(SMALL_CHAT, scale=0.5), 2.0, 30.0, seed=0)
    assert statistics.fmean(len(r.prompt) for r in half) < 0.6 * statistics.fmean(len(r.prompt) for r in full)


def test_long_prompts_are_2k_to_8k_tokens_over_a_shared_instruction_with_64_to_256_output_tokens() -> None:
    long = LongWorkload()
    sessions = list(itertools.islice(long.sessions(random.Random(0)), 200))
    assert all(len(s) == 1 for s in sessions)  # one request per user
    turns = [s[0] for s in sessions]
    assert all(2048 <= len(t.prompt) <= 8192 - t.max_tokens and 64 <= t.max_tokens <= 256 for t in turns)
    assert min(len(t.prompt) for t in turns) < 2600 and max(len(t.prompt) for t in turns) > 7600  # the whole range
    assert min(t.max_tokens for t in turns) < 80 and max(t.max_tokens for t in turns) > 240
    assert len({t.prompt[:256] for t in turns}) == long.instructions  # the shared part
    assert len({t.prompt[256:512] for t in turns}) == len(turns)  # the rest is each user's own


def test_a_prompt_scale_shrinks_long_prompts_and_not_their_outputs() -> None:
    small = [s[0] for s in itertools.islice(LongWorkload(scale=0.25).sessions(random.Random(0)), 100)]
    assert all(512 <= len(t.prompt) <= 2048 and 64 <= t.max_tokens <= 256 for t in small)
    assert statistics.fmean(t.max_tokens for t in small) > 128


def test_max_tokens_caps_long_outputs_and_prompts_leave_room_for_them() -> None:
    capped = LongWorkload(max_tokens=100, prompt_tokens=(4000, 9000), max_prompt_tokens=4096)
    turns = [s[0] for s in itertools.islice(capped.sessions(random.Random(1)), 100)]
    assert {t.max_tokens for t in turns} <= set(range(64, 101)) and 100 in {t.max_tokens for t in turns}
    assert all(len(t.prompt) + t.max_tokens <= 4096 for t in turns)


@pytest.mark.parametrize("fields", [{"instruction_tokens": 8000}, {"output_tokens": (256, 64)},
                                    {"prompt_tokens": (4096, 2048)}, {"instructions": 0}])
def test_long_refuses_settings_no_request_can_meet(fields: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        LongWorkload(**fields)  # type: ignore[arg-type]


def test_without_max_tokens_each_workload_keeps_its_own_outputs_and_with_it_all_take_it() -> None:
    chat, long = chosen_workloads(("chat", "long"), None, 16, None, 0.5)
    assert (chat.max_tokens, long.max_tokens, long.scale) == (8, 256, 0.5)  # type: ignore[attr-defined]
    chat, long, trace = chosen_workloads(("chat", "long", "trace"), TRACE, 16, 32, 1.0)
    assert chat.max_tokens == long.max_tokens == trace.max_tokens == 32  # type: ignore[attr-defined]
    assert {s[0].max_tokens for s in itertools.islice(long.sessions(random.Random(0)), 20)} == {32}


def test_trace_prompts_map_one_trace_block_to_one_cluster_block_in_file_order() -> None:
    trace = TraceWorkload(TRACE, block_size=8, max_prompt_blocks=4, max_tokens=5)
    requests = schedule(trace, 50.0, 2.0, seed=0)
    original = read_trace(TRACE, limit=len(requests))
    assert len(requests) > 50
    for r, t in zip(requests, original):
        assert len(r.prompt) == 8 * min(4, len(t.hash_ids))
        assert r.max_tokens == max(1, min(5, t.output_length))
    # the trace's first two requests share hash id 0, so their prompts share the first block exactly
    assert requests[0].prompt[:8] == requests[1].prompt[:8] and requests[0].prompt[8:] != requests[1].prompt[8:]


def test_a_finite_trace_stops_the_schedule_when_it_runs_out(tmp_path: Path) -> None:
    small = tmp_path / "t.jsonl"
    small.write_text("\n".join(TRACE.read_text().splitlines()[:5]) + "\n")
    assert len(schedule(TraceWorkload(small, block_size=4), 100.0, 10.0, seed=0)) == 5


def test_convo_conversations_share_nothing_between_users() -> None:
    sessions = list(itertools.islice(ConvoWorkload().sessions(random.Random(3)), 40))
    firsts = {s[0].prompt[:16] for s in sessions}
    assert len(firsts) == len(sessions)  # no two users start alike (no system prompt)
    for s in sessions:  # each user resends its own conversation
        assert all(b.prompt[: len(a.prompt)] == a.prompt for a, b in itertools.pairwise(s))


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_the_results_settings_name_each_generator_and_hold_every_field(name: str) -> None:
    w = GENERATORS[name]()
    settings = workload_settings(w)
    assert settings["name"] == name and set(settings) == {f.name for f in dataclasses.fields(w)}
