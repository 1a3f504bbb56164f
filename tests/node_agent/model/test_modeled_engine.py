"""The modeled engine (node_agent/model/modeled): profiles as data, the step time model, outputs that are
a seeded function of the prompt, the engine's waits, and agents that pull at the profile's wire time."""

import asyncio
import time
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from radixmesh.common.text.tokenizer import ByteTokenizer
from radixmesh.node_agent import ModeledEngine, ProfileError, load_profile, parse_engine, profile_names
from radixmesh.node_agent.agent import NodeAgent
from radixmesh.node_agent.engine.config import EngineConfig
from radixmesh.node_agent.engine.engine import Engine, StepOutput
from radixmesh.node_agent.engine.request import Request, RequestId
from radixmesh.node_agent.engine.runner import EngineRunner, Finished
from radixmesh.node_agent.memory.config import MemoryConfig
from radixmesh.node_agent.model.modeled.forward import ModeledModel
from radixmesh.node_agent.model.modeled.profile import PROFILES_DIR, Figures
from radixmesh.node_agent.model.modeled.time_model import PrefillChunk, StepTimeModel
from radixmesh.node_agent.model.source import random_source
from radixmesh.proto.serve.plan import PullPlan
from radixmesh.proto.serve.sampling import SamplingParams
from tests.support.agents import agent_config, collect, plan, prompt
from tests.support.tiny_model import BS, SOURCE

REQUIRED = {"h100-llama3-8b", "h200-llama3-8b", "h100x4-llama3-70b", "cpu-smollm2"}
H100 = load_profile("h100-llama3-8b")


def engine(model: ModeledModel, *, caching: bool = True, blocks: int = 96, budget: int = 512) -> Engine:
    return Engine(model, EngineConfig(block_size=BS, max_num_batched_tokens=budget, model_id="modeled",
                                      memory=MemoryConfig(num_gpu_blocks=blocks, enable_prefix_caching=caching)))


def modeled(speedup: float = 1000.0, **kw: object) -> ModeledModel:
    return ModeledModel(SOURCE.config, StepTimeModel(H100.figures), speedup=speedup, **kw)  # type: ignore[arg-type]


def generate(e: Engine, rid: str, tokens: tuple[int, ...], max_tokens: int = 6) -> tuple[int, ...]:
    req = Request(RequestId(rid), tokens, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    out = e.generate([req])[0].output_token_ids
    e.check_invariants()
    return out


# --- profiles --------------------------------------------------------------------------------------
def test_packaged_profiles_load_and_every_figure_has_a_source() -> None:
    assert REQUIRED <= set(profile_names())
    for name in profile_names():
        p = load_profile(name)
        assert p.name == name and set(p.sources) == {f for f in Figures.__slots__}  # type: ignore[attr-defined]
        assert all(s.strip() for s in p.sources.values())


def _write(tmp_path: Path, doc: object) -> str:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(doc) if not isinstance(doc, str) else doc)
    return str(path)


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d["figures"].pop("link_gbps"), "missing ['link_gbps']"),
    (lambda d: d["figures"]["link_gbps"].update(source=" "), "figure link_gbps has no source"),
    (lambda d: d["figures"]["linear_s_per_token"].update(value=-1.0), "linear_s_per_token must be a finite number >= 0"),
    (lambda d: d["figures"]["kv_bytes_per_token"].update(value=0), "kv_bytes_per_token must be > 0"),
    (lambda d: d["figures"]["link_gbps"].update(value="fast"), "link_gbps must be a finite number"),
    (lambda d: d["figures"].update(turbo={"value": 1, "source": "x"}), "unknown ['turbo']"),
    (lambda d: d.update(gpu="h100"), "unknown keys ['gpu']"),
    (lambda d: d.pop("model"), "model must be a non-empty string"),
    (lambda d: d["figures"].update(link_gbps=40.0), "figure link_gbps must be {value: NUMBER, source: TEXT}"),
])
def test_a_bad_profile_is_refused_naming_the_file_and_the_problem(tmp_path: Path, edit, message: str) -> None:  # type: ignore[no-untyped-def]
    doc = yaml.safe_load((PROFILES_DIR / "h100-llama3-8b.yaml").read_text())
    edit(doc)
    path = _write(tmp_path, doc)
    with pytest.raises(ProfileError) as e:
        load_profile(path)
    assert path in str(e.value) and message in str(e.value)


def test_unknown_profile_and_unreadable_yaml_say_what_is_valid(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="unknown profile 'a100'; valid: .*h100-llama3-8b"):
        load_profile("a100")
    with pytest.raises(ProfileError, match="not valid YAML"):
        load_profile(_write(tmp_path, "name: [unclosed"))
    with pytest.raises(ProfileError, match="cannot read it"):
        load_profile(str(tmp_path / "missing.yaml"))


def test_engine_spec() -> None:
    assert parse_engine("real") is None
    assert parse_engine("modeled").profile.name == "h100-llama3-8b"  # type: ignore[union-attr]
    m = parse_engine("modeled:cpu-smollm2", speedup=2.0)
    assert m is not None and (m.label, m.speedup, m.profile.model) == ("modeled:cpu-smollm2", 2.0, "smollm2-135m-instruct")
    for bad in ("fake", "modeled:", "modelled:h100-llama3-8b"):
        with pytest.raises(ValueError, match="valid: real, modeled, modeled:PROFILE"):
            parse_engine(bad)
    with pytest.raises(ValueError, match="speedup must be > 0"):
        ModeledEngine(H100, speedup=0.0)


# --- the time model --------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_step_time_grows_with_tokens_and_context(name: str) -> None:
    t = StepTimeModel(load_profile(name).figures)
    assert t.step_s([], []) == 0.0
    prefill = [t.prefill_s(n) for n in (1, 16, 256, 1024, 4096)]
    assert prefill == sorted(prefill) and prefill[-1] > prefill[-2] > prefill[-3]  # a floor may hold the first flat
    assert all(t.prefill_s(512, c) < t.prefill_s(512, c + 512) for c in (0, 512, 2048))
    decode = [t.step_s([], [512] * b) for b in (1, 8, 64)]
    assert decode == sorted(decode)
    assert t.step_s([], [128] * 8) < t.step_s([], [4096] * 8)
    assert t.step_s([PrefillChunk(256, 0)], [512] * 8) > t.prefill_s(256)  # decodes riding along cost something


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_cached_context_costs_less_than_recomputing_it(name: str) -> None:
    t = StepTimeModel(load_profile(name).figures)
    for cached, new in ((512, 32), (1536, 64), (4096, 256)):
        assert t.prefill_s(new, cached) < t.prefill_s(cached + new)
        # and a pull of the cached part at the profile's link beats recomputing it on every GPU profile
        if name != "cpu-smollm2":
            assert t.wire_s(cached) < t.prefill_s(cached + new) - t.prefill_s(new, cached)


def test_h100_figures_match_their_sanity_checks() -> None:
    t = StepTimeModel(H100.figures)
    assert t.step_s([], [1]) == pytest.approx(7.2e-3, rel=0.02)  # batch-1 decode, the profile's comment
    assert 4096 / t.prefill_s(4096) == pytest.approx(27_000, rel=0.1)  # ~30.8k tokens/s less attention
    assert t.wire_s(16) == pytest.approx(16 * 131072 / 40e9)


# --- outputs: a seeded function of the prompt ------------------------------------------------------
def test_outputs_equal_cached_uncached_chunked_and_across_engines() -> None:
    tokens = prompt(4, 100)
    cold = generate(engine(modeled(), caching=False), "a", tokens)
    warm = engine(modeled())
    assert generate(warm, "a", tokens) == cold
    assert generate(warm, "b", tokens) == cold and warm.counters.computed_tokens < 2 * len(tokens) + 12
    assert generate(engine(modeled(), budget=16), "c", tokens) == cold  # chunked prefill: state read back from KV
    assert generate(engine(modeled(), caching=False), "d", tokens[:99] + (7,)) != cold
    assert generate(engine(modeled(seed=1), caching=False), "e", tokens) != cold


def test_outputs_stay_in_the_tokenizer_vocabulary_and_never_stop_early() -> None:
    tok = ByteTokenizer()
    model = ModeledEngine(H100, speedup=1000.0).model(random_source("llama3-8b").config, tokenizer=tok)
    e = Engine(model, EngineConfig(block_size=BS, model_id="m", memory=MemoryConfig(num_gpu_blocks=4096)))
    outs = [generate(e, f"r{i}", prompt(i, 20), max_tokens=64) for i in range(8)]
    assert all(len(o) == 64 and all(0 <= t < tok.vocab_size and t not in tok.stop_token_ids for t in o) for o in outs)
    assert tok.decode([t for o in outs for t in o])  # the router can detokenize them


def test_a_corrupted_cached_block_changes_the_output() -> None:
    tokens = prompt(5, 40)
    e = engine(modeled())
    first = generate(e, "a", tokens)
    e.memory.kv.add_(1.0)  # every cached block's state now wrong
    assert generate(e, "b", tokens) != first


def test_preempted_and_recomputed_sequences_keep_their_tokens() -> None:
    prompts = [prompt(10 + i, 40) for i in range(4)]
    alone = [generate(engine(modeled(), caching=False), f"r{i}", p, 24) for i, p in enumerate(prompts)]
    tight = engine(modeled(), blocks=40)  # four sequences of 10 blocks growing to 16: someone is preempted
    reqs = [Request(RequestId(f"r{i}"), p, SamplingParams(max_tokens=24, ignore_eos=True)) for i, p in enumerate(prompts)]
    assert [o.output_token_ids for o in tight.generate(reqs)] == alone
    assert sum(tight.scheduler.num_preemptions.values()) > 0


# --- the engine's waits ----------------------------------------------------------------------------
def test_the_forward_waits_the_profile_time_divided_by_speedup() -> None:
    waits: list[float] = []
    model = modeled(speedup=4.0, clock=lambda: 100.0, sleep=waits.append)
    e = engine(model, caching=False)
    generate(e, "a", prompt(6, 64), max_tokens=3)
    t = StepTimeModel(H100.figures)
    expected = [t.prefill_s(64), t.step_s([], [65]), t.step_s([], [66])]
    assert waits == pytest.approx([s / 4.0 for s in expected])
    assert model.modeled_s == pytest.approx(sum(expected))


def test_the_runner_measures_the_step_floor_and_the_prefill_rate_beyond_it() -> None:
    """On a virtual clock the modeled forward advances by the profile's step time: the runner's floor
    is the decode-only steps' time, and its prefill rate counts a later prefill's time beyond it."""
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    model = modeled(speedup=1.0, clock=lambda: now[0], sleep=sleep)

    async def scenario() -> EngineRunner:
        runner = EngineRunner(engine(model, caching=False), clock=lambda: now[0])
        for rid, tokens in (("a", prompt(6, 64)), ("b", prompt(7, 200))):
            queue = await runner.submit(Request(RequestId(rid), tokens, SamplingParams(max_tokens=3, ignore_eos=True)))
            while not isinstance(item := await queue.get(), Finished):
                assert not isinstance(item, BaseException)
        await runner.close()
        return runner

    runner = asyncio.run(scenario())
    t = StepTimeModel(H100.figures)
    # a: its prefill (no floor yet: the whole step), two decodes (contexts 65, 66); b: its prefill, then
    # two decodes (201, 202); each an EWMA step of 0.2.
    floor = t.step_s([], [65])
    floor += 0.2 * (t.step_s([], [66]) - floor)
    rate = 64 / t.prefill_s(64)
    rate += 0.2 * (200 / (t.prefill_s(200) - floor) - rate)
    floor += 0.2 * (t.step_s([], [201]) - floor)
    floor += 0.2 * (t.step_s([], [202]) - floor)
    assert runner.step_floor_s == pytest.approx(floor)
    assert runner.prefill_tokens_per_s == pytest.approx(rate)
    # A short prefill costs about the floor: priced per token at a full chunk's rate it looked ~6x cheaper.
    assert t.prefill_s(32) > 5 * 32 / (512 / t.prefill_s(512))


def test_a_chunk_of_a_few_tokens_does_not_measure_the_prefill_rate() -> None:
    now = [0.0]
    runner = EngineRunner(engine(modeled(speedup=1.0), caching=False), clock=lambda: now[0])
    runner._measure(1, 1, 0.010)  # a decode-only step: the floor
    runner._measure(257, 1, 0.010 + 256 / 2000)  # 2,000 tokens/s beyond the floor
    runner._measure(3, 1, 0.010 + 0.004)  # 2 tokens in 4 ms beyond the floor: noise, not 500 tokens/s
    assert runner.prefill_tokens_per_s == pytest.approx(2000.0)
    runner._measure(17, 1, 0.010 + 16 / 1000)  # a chunk of RATE_MIN_CHUNK does
    assert runner.prefill_tokens_per_s == pytest.approx(2000 + 0.2 * (1000 - 2000))


def test_a_step_s_reads_into_the_gpu_tier_are_not_its_prefill_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """A promotion from disk inside a step is the router's swap time, priced apart: the rate counts
    the step's time less its reads (EngineCounters.moved_in_seconds)."""
    now = [0.0]
    runner = EngineRunner(engine(modeled(speedup=1.0), caching=False), clock=lambda: now[0])
    counters = runner.engine.counters

    def step(computed: int, forward_s: float, read_s: float) -> StepOutput:
        now[0] += forward_s + read_s
        counters.computed_tokens += computed
        counters.moved_in_seconds += read_s
        return StepOutput([], [])

    for computed, forward_s, read_s in ((64, 0.032, 0.0), (40, 0.020, 0.019), (64, 0.032, 0.0)):
        monkeypatch.setattr(runner.engine, "step", lambda c=computed, f=forward_s, r=read_s: step(c, f, r))
        runner._step()
    assert runner.prefill_tokens_per_s == pytest.approx(2000.0)


# --- agents ----------------------------------------------------------------------------------------
pytestmark = pytest.mark.anyio


def modeled_agent(node: str, engine_: ModeledEngine, **kw: object) -> NodeAgent:
    return NodeAgent(agent_config(node, modeled=engine_, **kw))


async def test_modeled_agent_labels_its_figures_and_prices_blocks_at_the_profile() -> None:
    agent = modeled_agent("m", ModeledEngine(H100, speedup=100.0))
    await agent.start()
    try:
        _, result = await collect(agent.serve(plan("q", prompt(1, 40))))
        assert len(result.output_token_ids) == 6
        assert agent.node_info().block_bytes == BS * 131072 and agent.layout.block_bytes == BS * 32
        assert 'radixmesh_agent_engine{engine="modeled:h100-llama3-8b"' in await agent.prometheus_text()
        assert agent.layout.model_id.startswith("modeled:h100-llama3-8b-")
        # its steps are waits, not work on this box's cores: it shares them with no other agent
        assert (await agent.load()).compute_group == ""
        real = NodeAgent(agent_config("r"))
        await real.start()
        try:
            assert (await real.load()).compute_group != ""  # a real engine's agents do
        finally:
            await real.stop()
    finally:
        await agent.stop()


async def test_a_pull_moves_the_state_and_takes_the_profile_wire_time() -> None:
    slow_link = replace(H100, figures=replace(H100.figures, link_gbps=0.5))  # 16 blocks of 4: 16.8 ms on the wire
    spec = ModeledEngine(slow_link, speedup=1.0)
    owner = modeled_agent("owner", spec, transfer="ucx", pull_timeout_s=5.0)
    puller = modeled_agent("puller", spec, transfer="ucx", pull_timeout_s=5.0)
    await owner.start()
    await puller.start()
    try:
        tokens = prompt(7, 70)
        _, first = await collect(owner.serve(plan("a", tokens)))
        pull = PullPlan("owner", owner.transfer_address, 0, 16)
        _, second = await collect(puller.serve(plan("b", tokens, pull=pull)))
        assert second.output_token_ids == first.output_token_ids
        s = second.stats
        assert s.tokens.remote == 64 and not s.pull_failed
        assert s.pull_bytes == 16 * BS * 131072  # counted at the profile's KV size
        assert s.pull_seconds >= 16 * BS * 131072 / 0.5e9
        await puller.check_invariants()
    finally:
        await puller.stop()
        await owner.stop()


async def test_an_idle_modeled_agent_is_cheap() -> None:
    agent = modeled_agent("idle", ModeledEngine(H100, speedup=1.0))
    await agent.start()
    try:
        await collect(agent.serve(plan("q", prompt(2, 40))))
        cpu0, wall0 = time.process_time(), time.monotonic()
        await asyncio.sleep(1.0)
        cpu = time.process_time() - cpu0
        assert cpu < 0.05 * (time.monotonic() - wall0), f"{cpu:.3f} CPU seconds in an idle second"
    finally:
        await agent.stop()
