"""Scheduling on the real pools: budgets, chunked prefill, preemption choice, no leaks, bad input."""


import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radixmesh.node_agent.engine.config import EngineConfig
from radixmesh.node_agent.engine.engine import Engine
from radixmesh.node_agent.engine.preemption import (
    CostPreemption,
    FixedPreemption,
    PreemptMode,
    make_preemption_policy,
)
from radixmesh.node_agent.engine.request import ExternalPrefix, Request, RequestId, RequestOutput
from radixmesh.node_agent.engine.sampler import sample
from radixmesh.node_agent.memory.config import MemoryConfig
from radixmesh.node_agent.memory.metrics import MemoryStats
from radixmesh.node_agent.model.llama import LlamaForCausalLM
from radixmesh.node_agent.model.weights import random_model
from radixmesh.proto.block_hash import hash_blocks
from radixmesh.proto.events import Tier
from radixmesh.proto.serve.limits import InvalidRequest
from radixmesh.proto.serve.sampling import SamplingParams
from tests.support.tiny_model import small_config

BS = 4
CFG = small_config(vocab_size=64, intermediate_size=48, max_position_embeddings=256)
MODEL = random_model(CFG, seed=11)


def make_engine(gpu: int, host: int = 0, budget: int = 16, policy: str = "cost", caching: bool = True,
                model: LlamaForCausalLM = MODEL) -> Engine:
    return Engine(model, EngineConfig(block_size=BS, max_num_batched_tokens=budget, preemption=policy,
                                      memory=MemoryConfig(num_gpu_blocks=gpu, num_host_blocks=host,
                                                          enable_prefix_caching=caching)))


def req(name: str, prompt: list[int], max_tokens: int = 8, **kw: object) -> Request:
    return Request(RequestId(name), tuple(prompt), SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                   **kw)  # type: ignore[arg-type]


def drain(eng: Engine) -> dict[str, RequestOutput]:
    """Step until idle, checking invariants after every step and that the tokens each step emitted
    are, in order, exactly each finished request's output."""
    done: dict[str, RequestOutput] = {}
    emitted: dict[str, list[int]] = {}
    while eng.has_work:
        step = eng.step()
        for rid, token, _ in step.tokens:
            emitted.setdefault(rid, []).append(token)
        for out in step.finished:
            done[out.request_id] = out
            assert emitted.pop(out.request_id) == list(out.output_token_ids)
        eng.check_invariants()
    return done


def assert_no_leak(eng: Engine) -> None:
    eng.check_invariants()
    assert [eng.memory.block_counts(t).in_use for t in (Tier.GPU, Tier.HOST)] == [0, 0]


def test_many_requests_under_a_small_pool_all_finish_with_preemptions_counted() -> None:
    eng = make_engine(gpu=12, host=24, budget=16)
    prompts = {f"r{i}": [(7 * i + j) % 60 + 2 for j in range(5 + 3 * (i % 4))] for i in range(16)}
    for name, p in prompts.items():
        eng.submit(req(name, p, max_tokens=12))
    done = drain(eng)
    assert sorted(done) == sorted(prompts)
    assert all(len(o.output_token_ids) == 12 for o in done.values())
    total = sum(eng.scheduler.num_preemptions.values())
    assert total > 0
    assert sum(o.stats.preemptions for o in done.values()) == total
    [gpu] = [s for s in eng.memory.stats_snapshots() if isinstance(s, MemoryStats) and s.tier == Tier.GPU]
    assert gpu.preemptions == total
    assert_no_leak(eng)
    text = eng.prometheus_text()
    assert "radixmesh_engine_preemptions_total" in text and 'tier="host"' in text


def test_chunked_prefill_respects_the_token_budget() -> None:
    eng = make_engine(gpu=32, budget=16)
    eng.submit(req("long", list(range(2, 42)), max_tokens=2))
    eng.submit(req("short", [5, 6, 7], max_tokens=2))
    steps = 0
    first_token_step = None
    while eng.has_work:
        before = eng.counters.computed_tokens
        eng.step()
        steps += 1
        assert eng.counters.computed_tokens - before <= 16
        if first_token_step is None and eng.counters.generated_tokens >= 2:
            first_token_step = steps
    # 40 + 3 prompt tokens at 16 a step: both first tokens arrive in the third step.
    assert first_token_step == 3 and steps == 4
    assert_no_leak(eng)


def test_the_most_recently_admitted_sequence_is_preempted() -> None:
    eng = make_engine(gpu=8, budget=64, policy="recompute", caching=False)
    eng.submit(req("old", list(range(2, 10)), max_tokens=12))
    eng.submit(req("new", list(range(20, 28)), max_tokens=12))
    done = drain(eng)
    assert done["old"].stats.preemptions == 0
    assert done["new"].stats.preemptions >= 1
    assert eng.scheduler.num_preemptions[PreemptMode.RECOMPUTE] >= 1
    assert_no_leak(eng)


def test_swap_falls_back_to_recompute_without_a_host_tier() -> None:
    eng = make_engine(gpu=8, budget=64, policy="swap", caching=False)
    eng.submit(req("old", list(range(2, 10)), max_tokens=12))
    eng.submit(req("new", list(range(20, 28)), max_tokens=12))
    drain(eng)
    assert eng.scheduler.num_preemptions[PreemptMode.SWAP] == 0
    assert eng.scheduler.num_preemptions[PreemptMode.RECOMPUTE] >= 1
    assert_no_leak(eng)


def test_cost_policy_compares_swap_time_with_recompute_time() -> None:
    policy = CostPreemption(block_bytes=1000, swap_bytes_per_s=1e6, prefill_tokens_per_s=100.0)
    assert policy.choose(num_blocks=2, num_tokens=1) is PreemptMode.SWAP  # 4 ms vs 10 ms
    assert policy.choose(num_blocks=10, num_tokens=1) is PreemptMode.RECOMPUTE  # 20 ms vs 10 ms
    policy.observe_prefill(tokens=1000, seconds=1.0)  # faster prefill: 100 -> 280 tokens/s
    assert policy.prefill_tokens_per_s == pytest.approx(280.0)
    assert policy.choose(num_blocks=2, num_tokens=1) is PreemptMode.RECOMPUTE  # 4 ms vs 3.6 ms
    assert isinstance(make_preemption_policy("swap", 1), FixedPreemption)
    with pytest.raises(ValueError, match="valid"):
        make_preemption_policy("lifo", 1)


def test_bad_requests_are_refused_before_any_block_is_taken() -> None:
    eng = make_engine(gpu=8, host=4)
    # The caller is the transfer plane, which holds external blocks through its handle, the gpu tier.
    plane = eng.memory.gpu
    ext_blocks = plane.pool.allocate(2)
    free_before = eng.memory.block_counts(Tier.GPU).free
    prompt = list(range(2, 14))
    bad = [
        req("empty", []),
        req("oov", [3, 64]),
        req("negative", [3, -1]),
        req("context", [3] * 250, max_tokens=10),
        req("pool", [3] * 30, max_tokens=8),
        req("ext-not-prompt", prompt, external_prefix=ExternalPrefix(
            tuple(ext_blocks), tuple(hash_blocks(list(range(30, 38)), BS)))),
        req("ext-gap", prompt, external_prefix=ExternalPrefix(
            tuple(ext_blocks), (hash_blocks(prompt, BS)[0], hash_blocks(prompt, BS)[2]))),
        req("ext-free-block", prompt, external_prefix=ExternalPrefix(
            (ext_blocks[0], ext_blocks[0] + 2), tuple(hash_blocks(prompt, BS)[:2]))),
    ]
    for r in bad:
        with pytest.raises(InvalidRequest):
            eng.submit(r)
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=0)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)
    eng.submit(req("ok", prompt))
    with pytest.raises(InvalidRequest, match="already active"):
        eng.submit(req("ok", prompt))
    # Nothing moved: the caller still holds its two blocks, no other block was taken.
    assert eng.memory.block_counts(Tier.GPU).free == free_before
    assert [plane.pool.ref_count(b) for b in ext_blocks] == [1, 1]
    assert not eng.has_work or len(eng.scheduler.waiting) == 1
    plane.pool.free(ext_blocks)
    drain(eng)
    assert_no_leak(eng)


def test_abort_releases_a_running_request() -> None:
    eng = make_engine(gpu=16)
    eng.submit(req("a", list(range(2, 20)), max_tokens=30))
    eng.step()
    assert eng.memory.block_counts(Tier.GPU).in_use > 0
    assert eng.abort(RequestId("a")) and not eng.abort(RequestId("a"))
    assert not eng.has_work
    assert_no_leak(eng)


def test_seeded_sampling_is_reproducible_and_top_p_keeps_the_head() -> None:
    logits = torch.tensor([2.0, 1.9, -5.0, 0.5])
    params = SamplingParams(temperature=1.0)
    draws = [sample(logits, params, seed=3, index=i) for i in range(40)]
    assert draws == [sample(logits, params, seed=3, index=i) for i in range(40)]
    assert len(set(draws)) > 1
    narrow = SamplingParams(temperature=1.0, top_p=0.3)
    assert {sample(logits, narrow, seed=s, index=0) for s in range(30)} == {0}


def test_seeded_sampling_survives_preemption() -> None:
    params = SamplingParams(max_tokens=12, temperature=0.8, top_p=0.9, seed=5)
    reqs = [Request(RequestId(f"s{i}"), tuple(range(2 + i, 10 + i)), params) for i in range(3)]
    alone = [make_engine(gpu=64).generate([r])[0].output_token_ids for r in reqs]
    tight = make_engine(gpu=9, host=16, budget=64)
    got = [o.output_token_ids for o in tight.generate(reqs)]
    assert sum(tight.scheduler.num_preemptions.values()) > 0
    assert got == alone


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lengths=st.lists(st.tuples(st.integers(1, 14), st.integers(1, 10)), min_size=1, max_size=7),
    gpu=st.integers(8, 16),
    host=st.sampled_from([0, 12]),
    policy=st.sampled_from(["cost", "swap", "recompute"]),
    budget=st.integers(1, 24),
    caching=st.booleans(),
)
def test_any_mix_finishes_with_the_tokens_of_an_unconstrained_run(
        lengths: list[tuple[int, int]], gpu: int, host: int, policy: str, budget: int, caching: bool) -> None:
    reqs = [req(f"p{i}", [(3 * i + j) % 5 + 2 for j in range(n)], max_tokens=m) for i, (n, m) in enumerate(lengths)]
    oracle = make_engine(gpu=64, budget=256, caching=False)
    want = {r.request_id: oracle.generate([r])[0].output_token_ids for r in reqs}
    eng = make_engine(gpu=gpu, host=host, budget=budget, policy=policy, caching=caching)
    for r in reqs:
        eng.submit(r)
    done = drain(eng)
    assert {k: v.output_token_ids for k, v in done.items()} == want
    assert_no_leak(eng)


def test_a_request_sharing_a_prefix_another_is_computing_waits_for_it_then_hits_it() -> None:
    """Two prompts over one uncached 4-block prefix, submitted at once with room for both in a step:
    the second waits one step for the first to compute the prefix, then hits it, so the prefix is
    computed once; without prefix caching both run at once. Tokens as from each alone."""
    prefix = [(5 * j) % 60 + 2 for j in range(4 * BS)]
    prompts = {"a": prefix + [3, 4, 5], "b": prefix + [6, 7]}
    alone = {name: drain_one(make_engine(gpu=32, budget=64), req(name, p)) for name, p in prompts.items()}
    for caching in (True, False):
        eng = make_engine(gpu=32, budget=64, caching=caching)
        for name, p in prompts.items():
            eng.submit(req(name, p))
        steps = []
        while eng.has_work:
            steps.append(eng.step())
            eng.check_invariants()
        assert [rid for rid, _, _ in steps[0].tokens] == (["a"] if caching else ["a", "b"])
        done = {out.request_id: out for step in steps for out in step.finished}
        assert {n: o.output_token_ids for n, o in done.items()} == {n: o.output_token_ids for n, o in alone.items()}
        b = done["b"].stats.sources
        assert b is not None and (b.local_gpu, b.computed) == ((4 * BS, 2) if caching else (0, len(prompts["b"])))
        assert_no_leak(eng)


def test_a_request_is_not_held_for_a_prefix_nobody_computes() -> None:
    # b shares a's prefix, but a computed it in an earlier step: b is admitted at once and hits it.
    prefix = [(3 * j) % 60 + 2 for j in range(4 * BS)]
    eng = make_engine(gpu=32, budget=64)
    eng.submit(req("a", prefix + [3], max_tokens=4))
    eng.step()
    eng.submit(req("b", prefix + [9], max_tokens=4))
    assert {rid for rid, _, _ in eng.step().tokens} == {"a", "b"}
    done: dict[str, RequestOutput] = {}
    while eng.has_work:
        done.update((out.request_id, out) for out in eng.step().finished)
    assert_no_leak(eng)
    assert done["b"].stats.sources is not None and done["b"].stats.sources.local_gpu == 4 * BS


def drain_one(eng: Engine, request: Request) -> RequestOutput:
    eng.submit(request)
    return drain(eng)[request.request_id]
