"""Prefill-only requests (the prefill phase of a split request) and what a following peer asks of the
engine (Engine.computing): the prompt's blocks are cached chunk by chunk, nothing is sampled."""

from radixmesh.node_agent.engine.engine import Engine
from radixmesh.node_agent.engine.request import RequestOutput
from radixmesh.proto.block_hash import hash_blocks
from radixmesh.proto.serve.sampling import FinishReason
from tests.node_agent.engine.test_scheduler import BS, assert_no_leak, drain_one, make_engine, req

PROMPT = [(i * 5 + 1) % 60 + 2 for i in range(6 * BS + 1)]  # 6 full blocks, then the last token


def drain(eng: Engine) -> dict[str, RequestOutput]:
    """Step until idle, checking invariants after every step."""
    done: dict[str, RequestOutput] = {}
    while eng.has_work:
        done.update((out.request_id, out) for out in eng.step().finished)
        eng.check_invariants()
    return done


def test_a_prefill_only_request_caches_its_prompt_and_samples_nothing() -> None:
    eng = make_engine(gpu=32, budget=64)
    eng.submit(req("p", PROMPT, prefill_only=True))
    out = drain(eng)["p"]
    assert (out.output_token_ids, out.finish_reason) == ((), FinishReason.PREFILLED)
    assert out.stats.first_token_s is None and eng.counters.generated_tokens == 0
    assert eng.counters.finished == {"prefilled": 1}
    assert_no_leak(eng)
    # A request of the same prompt then hits every full block and decodes as from scratch.
    alone = drain_one(make_engine(gpu=32, budget=64), req("r", PROMPT))
    eng.submit(req("r", PROMPT))
    again = drain(eng)["r"]
    assert again.output_token_ids == alone.output_token_ids
    assert again.stats.sources is not None and again.stats.sources.local_gpu == 6 * BS


def test_computing_names_the_blocks_a_request_has_yet_to_compute_chunk_by_chunk() -> None:
    hashes = hash_blocks(PROMPT, BS)
    eng = make_engine(gpu=32, budget=2 * BS)  # two blocks per step
    eng.submit(req("p", PROMPT, prefill_only=True))
    cache = eng.memory.gpu.cache
    assert [eng.computing(h) for h in hashes] == [True] * 6 and not any(h in cache for h in hashes)
    eng.step()  # blocks [0, 2) computed and cached; [2, 6) still coming
    assert [eng.computing(h) for h in hashes] == [False, False, True, True, True, True]
    assert [h in cache for h in hashes] == [True, True, False, False, False, False]
    while eng.has_work:
        eng.step()
    assert not any(eng.computing(h) for h in hashes) and all(h in cache for h in hashes)
    assert not eng.computing(hash_blocks([9] * BS, BS)[0])  # nobody computes an unknown block
    assert_no_leak(eng)


def test_an_aborted_prefill_computes_nothing_any_more() -> None:
    hashes = hash_blocks(PROMPT, BS)
    eng = make_engine(gpu=32, budget=2 * BS)
    eng.submit(req("p", PROMPT, prefill_only=True))
    eng.step()
    assert eng.abort(req("p", PROMPT).request_id)
    assert not any(eng.computing(h) for h in hashes)
    assert_no_leak(eng)
