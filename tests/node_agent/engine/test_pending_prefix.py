"""A request queued while its prefix is pulled (Request.pending_prefix): blocks allocated at submit,
passed over by admission without holding up the queue, admitted once the pull lands, exact tokens
whatever arrived, and no block freed before the pull lands, aborted or not."""

import asyncio

import pytest

from radixmesh.node_agent.engine.engine import Engine
from radixmesh.node_agent.engine.request import ExternalPrefix, RequestId, RequestOutput
from radixmesh.node_agent.engine.runner import EngineRunner, Finished
from radixmesh.node_agent.memory.sequence import PendingPrefix
from radixmesh.proto.events import Tier
from radixmesh.proto.serve.limits import InvalidRequest
from tests.node_agent.engine.test_scheduler import BS, drain, make_engine, req
from tests.support.poll import until

PROMPT = [(i * 7 + 3) % 64 for i in range(26)]  # 6 full blocks, all 6 usable (token 26 is computed)


def reference(prompt: list[int]) -> tuple[int, ...]:
    eng = make_engine(64, caching=False)
    eng.submit(req("ref", prompt))
    return drain(eng)["ref"].output_token_ids


def owner() -> Engine:
    """An engine that computed PROMPT: the peer a pull copies from."""
    eng = make_engine(64)
    eng.submit(req("o", PROMPT))
    drain(eng)
    return eng


def finish(eng: Engine) -> dict[str, RequestOutput]:
    """Step until idle (after steps the test took itself, so drain's check of every token cannot hold)."""
    done: dict[str, RequestOutput] = {}
    while eng.has_work:
        done.update((out.request_id, out) for out in eng.step().finished)
        eng.check_invariants()
    return done


def land_from(src: Engine, dst: Engine, pull: PendingPrefix, received: int) -> None:
    """What the transfer plane does, through its handle on each node's memory (the gpu tier, as the
    agent gives it): write the first `received` blocks' KV, then land the pull."""
    source, dest = src.memory.gpu, dst.memory.gpu
    ids = source.cache.match(list(pull.hashes[:received]))
    assert len(ids) == received
    dest.kv[list(pull.block_ids[:received])] = source.kv[ids]
    source.cache.release(ids)
    dst.land_pull(pull, received)


def test_submit_allocates_the_blocks_missing_after_the_local_prefix() -> None:
    eng = make_engine(64)
    eng.submit(req("local", PROMPT[:9]))  # caches blocks 0-1 here
    drain(eng)
    pull = PendingPrefix(6)
    eng.submit(req("p", PROMPT, pending_prefix=pull))
    assert (pull.start, len(pull.block_ids), len(pull.hashes)) == (2, 4, 4)
    assert pull.parent is not None and pull.parent not in pull.hashes
    assert eng.memory.block_counts(Tier.GPU).in_use == 4
    eng.check_invariants()  # the pull's blocks are accounted for while it streams


def test_a_waiting_pull_holds_up_no_one_and_its_request_runs_once_landed() -> None:
    src, eng = owner(), make_engine(64)
    pull = PendingPrefix(6)
    eng.submit(req("p", PROMPT, pending_prefix=pull))
    eng.submit(req("q", [5, 6, 7, 8, 9], max_tokens=20))
    tokens: dict[str, int] = {}
    for _ in range(5):  # the pull streams for five steps: q, queued behind p, decodes meanwhile
        for rid, _token, _ in eng.step().tokens:
            tokens[rid] = tokens.get(rid, 0) + 1
        eng.check_invariants()
    assert tokens == {"q": 5}
    waiting = eng.sequence(RequestId("p"))
    assert waiting is not None and waiting.pulling is pull and waiting.stats.sources is None
    land_from(src, eng, pull, 6)
    out = finish(eng)
    assert out["p"].output_token_ids == reference(PROMPT)
    assert (out["p"].stats.sources.remote, out["p"].stats.sources.computed) == (24, 2)  # type: ignore[union-attr]
    assert eng.memory.block_counts(Tier.GPU).in_use == 0


def test_a_step_with_nothing_but_pulls_to_wait_for_is_idle_and_a_landed_pull_ends_it() -> None:
    src, eng = owner(), make_engine(64)
    pull = PendingPrefix(6)
    eng.submit(req("p", PROMPT, pending_prefix=pull))
    assert eng.step() == ([], []) and eng.scheduler.idle  # EngineRunner's driver sleeps on this
    land_from(src, eng, pull, 6)
    assert eng.step().tokens and not eng.scheduler.idle


def test_the_runner_sleeps_while_only_pulls_are_awaited_and_the_landing_wakes_it() -> None:
    async def scenario() -> tuple[int, RequestOutput]:
        src, eng = owner(), make_engine(64)
        runner = EngineRunner(eng)
        pull = PendingPrefix(6)
        queue = await runner.submit(req("p", PROMPT, pending_prefix=pull))
        await until(lambda: eng.scheduler.idle)
        before = eng.counters.steps
        await asyncio.sleep(0.3)  # a measurement window: a spinning driver steps thousands of times in it
        idle_steps = eng.counters.steps - before
        await runner.call(land_from, src, eng, pull, 6)
        while not isinstance(item := await queue.get(), Finished):
            assert not isinstance(item, BaseException)
        await runner.close()
        return idle_steps, item.output

    idle_steps, out = asyncio.run(scenario())
    assert idle_steps <= 1
    assert out.output_token_ids == reference(PROMPT)


@pytest.mark.parametrize("received", [0, 3])
def test_a_failed_or_partial_pull_computes_the_rest_and_gives_the_same_tokens(received: int) -> None:
    src, eng = owner(), make_engine(64)
    pull = PendingPrefix(6)
    eng.submit(req("p", PROMPT, pending_prefix=pull))
    land_from(src, eng, pull, received)
    out = drain(eng)["p"]
    assert out.output_token_ids == reference(PROMPT)
    assert out.stats.sources is not None and out.stats.sources.remote == received * BS
    assert out.stats.sources.computed == len(PROMPT) - received * BS
    assert eng.memory.block_counts(Tier.GPU).in_use == 0


def test_an_aborted_request_keeps_its_pull_blocks_until_the_pull_lands() -> None:
    src, eng = owner(), make_engine(64)
    pull = PendingPrefix(6)
    eng.submit(req("p", PROMPT, pending_prefix=pull))
    assert eng.abort(RequestId("p"))
    assert eng.memory.block_counts(Tier.GPU).in_use == 6  # the transfer may still write them
    eng.check_invariants()
    land_from(src, eng, pull, 2)
    eng.check_invariants()
    assert eng.memory.block_counts(Tier.GPU).in_use == 0
    assert eng.memory.cached_prefix(Tier.GPU, pull.hashes) == 2  # what arrived stays cached


def test_no_room_pulls_what_fits_and_a_full_local_prefix_pulls_nothing() -> None:
    eng = make_engine(16)
    plane = eng.memory.gpu  # the transfer plane's handle: it holds 13 blocks for another pull
    held = plane.pool.allocate(13)
    short = PendingPrefix(6)
    eng.submit(req("short", PROMPT, pending_prefix=short))
    assert (len(short.hashes), len(short.block_ids)) == (6, 3)
    plane.pool.free(held)
    eng.land_pull(short, 0)
    drain(eng)
    cached = PendingPrefix(6)  # "short" computed and cached all six blocks
    eng.submit(req("again", PROMPT, pending_prefix=cached))
    assert (cached.start, cached.block_ids) == (6, ())
    assert drain(eng)["again"].stats.sources.local_gpu == 24  # type: ignore[union-attr]


@pytest.mark.parametrize("pull", [PendingPrefix(7), PendingPrefix(-1), PendingPrefix(2, block_ids=(1,))])
def test_a_bad_pending_prefix_is_refused_and_takes_nothing(pull: PendingPrefix) -> None:
    eng = make_engine(64)
    with pytest.raises(InvalidRequest, match="pending prefix"):
        eng.submit(req("bad", PROMPT, pending_prefix=pull))
    assert eng.memory.block_counts(Tier.GPU).in_use == 0 and not eng.has_work


def test_a_request_cannot_both_bring_and_pull_its_prefix() -> None:
    eng = make_engine(64)
    held = eng.memory.gpu.pool.allocate(1)  # an external block, as the transfer plane holds one
    ext = ExternalPrefix(tuple(held), (eng.memory.sequences.block_hashes(eng.memory.new_sequence(PROMPT, b""), 1)[0],))
    with pytest.raises(InvalidRequest, match="not both"):
        eng.submit(req("both", PROMPT, external_prefix=ext, pending_prefix=PendingPrefix(6)))
    assert eng.memory.block_counts(Tier.GPU).in_use == 1


def test_a_request_sharing_the_prefix_a_waiting_request_pulls_waits_for_the_pull_and_hits_it() -> None:
    """q needs p's prefix, which p pulls: q is not admitted to compute it while the pull streams, and
    once it lands both hit it (q after p has it); tokens as without a cache."""
    src, eng = owner(), make_engine(64)
    pull = PendingPrefix(6)
    eng.submit(req("p", PROMPT, pending_prefix=pull))
    eng.submit(req("q", PROMPT[:24] + [1, 2]))
    for _ in range(3):
        assert eng.step().tokens == []
    land_from(src, eng, pull, 6)
    done = finish(eng)
    assert {n: o.output_token_ids for n, o in done.items()} == {"p": reference(PROMPT), "q": reference(PROMPT[:24] + [1, 2])}
    q = done["q"].stats.sources
    assert q is not None and (q.local_gpu, q.computed) == (24, 2)
    assert eng.memory.block_counts(Tier.GPU).in_use == 0
