"""The engine simulator (cluster/bench/engine_sim.py, node_agent's VirtualNode): a bench cell of a modeled
cluster in virtual time. Its times are the profile's time model step by step, its caches and routing the
production code's, and it is deterministic."""

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from radixmesh.cluster.bench.arms import arm_named
from radixmesh.cluster.bench.engine_sim import EngineSim, simulated_cell
from radixmesh.cluster.bench.metrics import Slo
from radixmesh.cluster.bench.runner import BenchPlan
from radixmesh.cluster.bench.schedule import BenchRequest, random_tokens, schedule
from radixmesh.cluster.bench.workloads import DocsWorkload
from radixmesh.cluster.cli.main import main
from radixmesh.cluster.launch.config import LauncherConfig
from radixmesh.cluster.router.admission import AdmissionLimits
from radixmesh.node_agent import EngineConfig, VirtualNode, parse_engine, resolve_model
from radixmesh.proto.ids import NodeId
from radixmesh.proto.serve.tokens import TokenSources

PROFILE = "modeled:h100-llama3-8b"


def cluster(nodes: int, **kw: object) -> LauncherConfig:
    modeled = parse_engine(PROFILE, 1.0)
    assert modeled is not None
    return LauncherConfig(local_nodes=nodes, model=resolve_model(modeled.profile.model), modeled=modeled,
                          gpu_blocks=512, **kw)  # type: ignore[arg-type]


def plan(duration_s: float = 30.0, ramp_s: float = 0.0, drain_s: float = 30.0) -> BenchPlan:
    return BenchPlan(DocsWorkload(), (arm_named("cost"),), (1.0,), duration_s, ramp_s, drain_s, slo=Slo(10.0, 1.0))


def request(index: int, at: float, prompt: tuple[int, ...], max_tokens: int, session: int = 0, turn: int = 0
            ) -> BenchRequest:
    return BenchRequest(index, at, session, turn, prompt, max_tokens)


def test_an_isolated_request_takes_the_time_models_steps() -> None:
    """100 prompt tokens then 4 output tokens on an idle node: one prefill step (its first token), then
    three decode steps over the growing context; TTFT and end to end are those steps' modeled times."""
    config = cluster(2)
    assert config.modeled is not None
    tm = config.modeled.model(config.model.config).time_model
    prompt = random_tokens(random.Random(0), 100, 256)
    cell = EngineSim(config).run(plan(), [request(0, 1.0, prompt, 4)])
    ttft = tm.prefill_s(100)
    e2e = ttft + sum(tm.step_s([], [context]) for context in (101, 102, 103))
    assert cell["requests"]["ok"] == 1
    assert cell["ttft_s"]["p50"] == pytest.approx(ttft)
    assert cell["e2e_s"]["p50"] == pytest.approx(e2e)
    assert cell["output_tokens_per_s"] * 30.0 == pytest.approx(4)


def test_a_sessions_next_turn_hits_its_first_turns_blocks() -> None:
    rng = random.Random(1)
    first = random_tokens(rng, 64, 256)
    second = first + random_tokens(rng, 32, 256)
    cell = EngineSim(cluster(2)).run(plan(), [request(0, 0.0, first, 2), request(1, 5.0, second, 2, turn=1)])
    # The first turn's 4 full blocks (64 tokens) are cached where the cost policy keeps the session.
    assert cell["hit_rate_by_source"]["local_gpu"] == pytest.approx(64 / (64 + 96))
    assert cell["prompt_tokens_computed"] == 64 + 32


def test_a_cell_is_the_same_every_time() -> None:
    requests = schedule(DocsWorkload(document_tokens=256), 4.0, 6.0, seed=3)
    p = plan(duration_s=4.0, ramp_s=2.0, drain_s=10.0)
    first = EngineSim(cluster(3), seed=3).run(p, requests)
    again = EngineSim(cluster(3), seed=3).run(p, requests)
    assert first == again
    assert first["requests"]["ok"] > 0 and first["hit_rate"] > 0


def test_admission_runs_the_slots_queues_up_to_the_bound_and_refuses_the_rest() -> None:
    """One slot, one waiting place: of three requests at once one runs, one waits for it, one is
    refused; a wait longer than max_wait_s is refused too."""
    prompts = [random_tokens(random.Random(i), 400, 256) for i in range(3)]
    burst = [request(i, 0.0, prompts[i], 8, session=i) for i in range(3)]
    limits = AdmissionLimits(max_running_per_node=1, max_waiting=1, max_wait_s=60.0)
    cell = EngineSim(cluster(1, admission=limits)).run(plan(), burst)
    assert (cell["requests"]["ok"], cell["requests"]["refused"]) == (2, 1)
    impatient = replace(limits, max_wait_s=1e-3)  # the first request takes longer than that
    cell = EngineSim(cluster(1, admission=impatient)).run(plan(), burst)
    assert (cell["requests"]["ok"], cell["requests"]["refused"]) == (1, 2)


def test_a_decisions_ttft_counts_from_its_routing_not_from_its_wait_for_admission() -> None:
    """As the live router's calibration does (Attempts.serve): the second of two requests waits for
    the first's whole run before it is routed; its prediction, made then, comes true from then."""
    prompts = [random_tokens(random.Random(i), 400, 256) for i in range(2)]
    burst = [request(i, 0.0, prompts[i], 8, session=i) for i in range(2)]
    limits = AdmissionLimits(max_running_per_node=1, max_waiting=1, max_wait_s=60.0)
    cell = EngineSim(cluster(1, admission=limits)).run(plan(), burst)
    assert cell["requests"]["ok"] == 2
    assert cell["ttft_s"]["p90"] > 2 * cell["ttft_s"]["p50"]  # the client saw the wait (p90: the later)
    ttft = cell["decisions"]["calibration"]["ttft"]
    assert ttft["n"] == 2 and ttft["p90"] <= 1.25  # the decision did not: from arrival, ~4x


def test_the_simulated_cell_runs_the_arms_cluster() -> None:
    requests = schedule(DocsWorkload(document_tokens=128), 4.0, 3.0, seed=0)
    p = plan(duration_s=2.0, ramp_s=1.0, drain_s=10.0)
    cell = simulated_cell(cluster(2), p)
    off, cost = cell(arm_named("off"), 4.0, requests, 0), cell(arm_named("cost"), 4.0, requests, 0)
    assert off["hit_rate"] == 0 and cost["hit_rate"] > 0  # off runs its agents without prefix caching


def test_a_split_request_prefills_on_one_agent_and_decodes_on_another() -> None:
    """1P1D: the prompt's KV is computed on the prefill agent (prefill-only), pulled by the decode agent
    after the prefill (its last chunk's wire time, streamed), which computes the tail and decodes."""
    config = replace(cluster(2), prefill_nodes=1, decode_nodes=1)
    assert config.modeled is not None
    tm = config.modeled.model(config.model.config).time_model
    prompt = random_tokens(random.Random(4), 200, 256)  # 12 full blocks and 8 tokens
    sim = EngineSim(config)
    cell = sim.run(plan(), [request(0, 0.0, prompt, 3)])
    assert cell["requests"]["ok"] == 1 and cell["handoff"]["handoffs"] == {"pulled": 1}
    assert sim.busy_s[NodeId("node-0")] == pytest.approx(tm.prefill_s(200))  # the prefill agent ran the prompt
    pull = sim._pull_s(12)
    first = tm.prefill_s(8, 192)  # the decode agent computes the tail after the 12 pulled blocks
    assert cell["ttft_s"]["p50"] == pytest.approx(tm.prefill_s(200) + pull + first)
    assert cell["e2e_s"]["p50"] == pytest.approx(cell["ttft_s"]["p50"] + tm.step_s([], [201]) + tm.step_s([], [202]))
    assert cell["hit_rate"] == 0  # the prefill phase counts the prompt: all computed


def test_a_next_turn_the_decode_agent_holds_is_served_there_whole() -> None:
    rng = random.Random(5)
    first = random_tokens(rng, 200, 256)
    second = first + random_tokens(rng, 40, 256)
    config = replace(cluster(2), prefill_nodes=1, decode_nodes=1)
    cell = EngineSim(config).run(plan(), [request(0, 0.0, first, 2), request(1, 10.0, second, 2, turn=1)])
    assert cell["requests"]["ok"] == 2
    assert cell["handoff"]["handoffs"] == {"pulled": 1}  # the first turn's only: the second ran on node-1
    assert cell["hit_rate_by_source"]["local_gpu"] == pytest.approx(192 / (200 + 240))
    held = replace(config, local_prefill_max_tokens=0)  # every request handed off
    assert EngineSim(held).run(plan(), [request(0, 0.0, first, 2), request(1, 10.0, second, 2, turn=1)]
                               )["handoff"]["handoffs"] == {"pulled": 2}


def virtual_node() -> VirtualNode:
    modeled = parse_engine(PROFILE, 1.0)
    assert modeled is not None
    return VirtualNode(EngineConfig(), modeled, resolve_model(modeled.profile.model))


def run_out(node: VirtualNode, request_id: str) -> TokenSources:
    """Step `node` until `request_id` has its first token; where its prompt came from."""
    while True:
        ran = node.step(node.t)
        assert ran is not None, "the node stopped before the request's first token"
        if request_id in ran.sources:
            return ran.sources[request_id]


@pytest.mark.parametrize("arrived", [8, 5])
def test_a_pulled_prefix_lands_as_remote_hits_and_the_rest_is_computed(arrived: int) -> None:
    peer, node = virtual_node(), virtual_node()
    prompt = random_tokens(random.Random(2), 8 * 16 + 10, 256)
    hashes = peer.hashes(prompt)
    assert peer.submit(0.0, "a", prompt, 1, hashes) is None
    run_out(peer, "a")
    assert peer.held_prefix(hashes) == 8
    pull = node.submit(0.0, "b", prompt, 1, hashes, pull_end_block=8)
    assert pull is not None and (pull.start, pull.blocks) == (0, 8)
    assert node.step(0.0) is None  # its only request waits for the pull: nothing to run
    node.land(0.5, pull, arrived)
    sources = run_out(node, "b")
    assert sources.remote == arrived * 16 and sources.computed == len(prompt) - arrived * 16


@pytest.mark.parametrize("handed_off", [True, False])
def test_blocks_a_node_handed_off_are_the_first_it_evicts(handed_off: bool) -> None:
    """As the agent's transfer source closes a delivered pull with hand-off on: the pulled blocks go to
    the front of the holder's eviction order; without it the least recently used go first."""
    node = virtual_node()
    rng = random.Random(4)
    older, newer = random_tokens(rng, 8 * 16, 256), random_tokens(rng, 8 * 16, 256)
    for rid, prompt in (("a", older), ("b", newer)):
        node.submit(node.t, rid, prompt, 1, node.hashes(prompt))
        run_out(node, rid)
    if handed_off:
        assert node.hand_off(node.hashes(newer)) == 8
    node.engine.memory.gpu.cache.pool.evict(8)
    kept, lost = (older, newer) if handed_off else (newer, older)
    assert node.held_prefix(node.hashes(kept)) == 8 and node.held_prefix(node.hashes(lost)) == 0


@pytest.mark.parametrize("handoff", [True, False])
def test_a_pull_with_hand_off_on_demotes_what_it_took_from_the_holder(handoff: bool) -> None:
    """The simulator closes a delivered pull as the holder's transfer source would: with hand-off on,
    the holder demotes the blocks the puller received (1P1D: the decode agent pulls the prompt's 12
    full blocks from the prefill agent); with it off, it keeps them where they were."""
    config = replace(cluster(2), prefill_nodes=1, decode_nodes=1, handoff=handoff)
    sim = EngineSim(config)
    cell = sim.run(plan(), [request(0, 0.0, random_tokens(random.Random(4), 200, 256), 3)])
    assert cell["handoff"]["handoffs"] == {"pulled": 1}
    assert sim.nodes[NodeId("node-0")].handed_off_blocks == (12 if handoff else 0)


def test_an_idle_node_does_not_step_and_its_clock_moves_only_by_its_steps() -> None:
    node = virtual_node()
    assert node.step(3.0) is None
    prompt = random_tokens(random.Random(3), 32, 256)
    node.submit(5.0, "a", prompt, 1, node.hashes(prompt))
    ran = node.step(5.0)
    assert ran is not None and ran.seconds > 0 and node.t == pytest.approx(5.0 + ran.seconds)
    assert ran.tokens == ran.finished == ["a"] and node.step(node.t) is None


@pytest.mark.parametrize(("args", "said"), [
    (["--local", "2", "--simulate"], "--engine modeled"),
    (["--url", "http://127.0.0.1:1", "--simulate"], "--local N"),
])
def test_simulate_is_refused_where_there_is_no_modeled_local_cluster(args: list[str], said: str) -> None:
    result = CliRunner().invoke(main, ["bench", *args])
    assert result.exit_code == 2 and said in result.output, result.output


def test_a_simulated_bench_writes_its_figures_labelled_simulated(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, [
        "bench", "--local", "2", "--engine", PROFILE, "--speedup", "0.1", "--simulate", "--workload", "docs",
        "--arms", "cost,round_robin", "--rates", "3", "--fixed-rates", "--duration", "2", "--ramp", "1",
        "--drain", "5", "--ttft-slo", "5", "--itl-slo", "1", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    doc = json.loads((tmp_path / "bench.json").read_text())
    assert doc["settings"]["engine"]["simulated"] is True
    assert "SIMULATED" in doc["settings"]["cluster"] and "SIMULATED" in doc["settings"]["engine"]["note"]
    assert {c["arm"] for c in doc["cells"]} == {"cost", "round_robin"}
    assert all(c["requests"]["ok"] > 0 for c in doc["cells"])


def test_a_bench_at_several_seeds_runs_each_and_reads_their_means(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, [
        "bench", "--local", "2", "--engine", PROFILE, "--speedup", "0.1", "--simulate", "--workload", "agent",
        "--arms", "cost,prefix_affinity", "--rates", "2", "--fixed-rates", "--duration", "2", "--ramp", "1",
        "--drain", "5", "--seeds", "3", "--seed", "7", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    doc = json.loads((tmp_path / "bench.json").read_text())
    assert sorted((c["arm"], c["seed"]) for c in doc["cells"]) == [
        (arm, seed) for arm in ("cost", "prefix_affinity") for seed in (7, 8, 9)]
    offered = {c["seed"]: c["requests"]["offered"] for c in doc["cells"] if c["arm"] == "cost"}
    assert len(set(offered.values())) > 1  # each seed its own arrivals
    mean = next(m for m in doc["means"] if m["arm"] == "cost")
    assert mean["seeds"] == [7, 8, 9] and mean["requests"]["offered"] == sum(offered.values())
    assert doc["settings"]["seeds"] == 3
