"""Greedy outputs are the same whatever the KV came from: (a) computed, (b) local prefix hits,
(c) external blocks, (d) swap-out/swap-in or recompute after preemption, (e) host-tier promotion,
(f) prefix blocks demoted to the host tier when the gpu tier evicted them."""

import random
from collections.abc import Sequence
from dataclasses import replace

import pytest

from radixmesh.kernels import ops as kernels
from radixmesh.node_agent.engine.config import EngineConfig
from radixmesh.node_agent.engine.engine import Engine
from radixmesh.node_agent.engine.request import ExternalPrefix, Request, RequestId, RequestOutput
from radixmesh.node_agent.memory.config import MemoryConfig
from radixmesh.node_agent.memory.sequence import PreemptMode
from radixmesh.node_agent.model.llama import LlamaForCausalLM
from radixmesh.proto.block_hash import hash_blocks
from radixmesh.proto.events import Tier
from radixmesh.proto.serve.limits import InvalidRequest
from radixmesh.proto.serve.sampling import SamplingParams
from tests.support.tiny_model import tiny_model

BS = 8
REL_TOL = 1e-5


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    return tiny_model(seed=0)


def make_requests(seed: int, n: int, prefix_len: int, max_tokens: int = 10) -> list[Request]:
    """n prompts sharing one random prefix (two groups share a longer one), random suffixes."""
    rng = random.Random(seed)
    shared = [rng.randrange(256) for _ in range(prefix_len)]
    longer = shared + [rng.randrange(256) for _ in range(2 * BS)]
    out = []
    for i in range(n):
        base = longer if i % 2 else shared
        suffix = [rng.randrange(256) for _ in range(rng.randrange(1, 2 * BS))]
        out.append(Request(RequestId(f"q{i}"), tuple(base + suffix),
                           SamplingParams(max_tokens=max_tokens, ignore_eos=True)))
    return out


def engine(model: LlamaForCausalLM, *, num_gpu_blocks: int, num_host_blocks: int = 0,
           caching: bool = True, budget: int = 512, preemption: str = "cost", demote: bool = True) -> Engine:
    memory = MemoryConfig(num_gpu_blocks=num_gpu_blocks, num_host_blocks=num_host_blocks,
                          enable_prefix_caching=caching, demote_evicted=demote)
    return Engine(model, EngineConfig(block_size=BS, keep_logits=True, max_num_batched_tokens=budget,
                                      preemption=preemption, memory=memory))


def run_checked(eng: Engine, requests: Sequence[Request]) -> list[RequestOutput]:
    """generate(), with every invariant checked after every step."""
    for r in requests:
        eng.submit(r)
    done: dict[str, RequestOutput] = {}
    while eng.has_work:
        for out in eng.step().finished:
            done[out.request_id] = out
        eng.check_invariants()
    eng.check_invariants()
    return [done[r.request_id] for r in requests]


def reference(model: LlamaForCausalLM, requests: Sequence[Request]) -> list[RequestOutput]:
    """(a): every request alone, nothing cached."""
    eng = engine(model, num_gpu_blocks=64, caching=False)
    return [eng.generate([r])[0] for r in requests]


def assert_same(got: Sequence[RequestOutput], want: Sequence[RequestOutput]) -> None:
    for g, w in zip(got, want, strict=True):
        assert g.output_token_ids == w.output_token_ids, g.request_id
        assert g.logits is not None and w.logits is not None
        for lg, lw in zip(g.logits, w.logits, strict=True):
            err = float((lg - lw).abs().max() / lw.abs().max())
            assert err <= REL_TOL, (g.request_id, err)


@pytest.mark.parametrize("seed", [1, 2])
def test_local_prefix_hits_match_no_cache(model: LlamaForCausalLM, seed: int) -> None:
    requests = make_requests(seed, 5, prefix_len=3 * BS + 3)
    want = reference(model, requests)
    eng = engine(model, num_gpu_blocks=64)
    got = [run_checked(eng, [r])[0] for r in requests]
    assert_same(got, want)
    assert got[0].stats.sources.local_gpu == 0
    assert all(o.stats.sources.local_gpu >= 3 * BS for o in got[1:])
    # Hits make the computed work smaller by exactly the cached tokens.
    for o in got:
        assert o.stats.forward_tokens == o.stats.prompt_tokens - o.stats.sources.local_gpu + 9


def test_concurrent_batch_with_chunked_prefill_matches_no_cache(model: LlamaForCausalLM) -> None:
    requests = make_requests(3, 6, prefix_len=4 * BS)
    want = reference(model, requests)
    got = run_checked(engine(model, num_gpu_blocks=96, budget=24), requests)
    assert_same(got, want)


def test_external_prefix_blocks_match_no_cache(model: LlamaForCausalLM) -> None:
    requests = make_requests(4, 3, prefix_len=3 * BS + 1)
    want = reference(model, requests)
    # A peer computes the shared prefix; its blocks are copied into this node's pool the way the
    # transfer plane does it (gather on the peer, scatter here), then handed in by the hook.
    peer = engine(model, num_gpu_blocks=32)
    run_checked(peer, [requests[0]])
    me = engine(model, num_gpu_blocks=64)
    outputs = []
    prefix_hashes = hash_blocks(requests[0].prompt_token_ids[: 3 * BS], BS)
    peer_gpu, my_gpu = peer.memory.gpu, me.memory.gpu  # the transfer plane's handles on each node's memory
    for r in requests:
        peer_ids = peer_gpu.cache.match(prefix_hashes)
        assert len(peer_ids) == 3
        mine = my_gpu.pool.allocate(3)
        kernels.scatter_blocks(kernels.gather_blocks(peer_gpu.kv, peer_ids), my_gpu.kv, mine)
        peer_gpu.cache.release(peer_ids)
        ext = ExternalPrefix(tuple(mine), tuple(prefix_hashes))
        req = Request(r.request_id, r.prompt_token_ids, r.sampling, external_prefix=ext)
        outputs += run_checked(me, [req])
    assert_same(outputs, want)
    assert outputs[0].stats.sources.remote == 3 * BS
    assert outputs[0].stats.sources.local_gpu == 0
    me.check_invariants()


def test_carried_prompt_hashes_match_no_cache(model: LlamaForCausalLM) -> None:
    """Requests that bring their prompt's hashes (as the agent's do) are served as if the engine had
    hashed them; a wrong number of hashes is refused."""
    requests = make_requests(5, 4, prefix_len=2 * BS + 3)
    want = reference(model, requests)
    eng = engine(model, num_gpu_blocks=64)
    carried = [replace(r, prompt_hashes=tuple(hash_blocks(r.prompt_token_ids, BS))) for r in requests]
    got = [run_checked(eng, [r])[0] for r in carried]  # one after another: later ones hit the prefix
    assert_same(got, want)
    assert sum(o.stats.sources.local_gpu for o in got) > 0  # the shared prefix hit
    short = replace(requests[0], request_id=RequestId("short"), prompt_hashes=carried[0].prompt_hashes[:-1])
    with pytest.raises(InvalidRequest, match="prompt hashes"):
        eng.submit(short)
    eng.check_invariants()


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_preemption_matches_no_cache(model: LlamaForCausalLM, mode: str) -> None:
    requests = make_requests(5, 5, prefix_len=2 * BS + 5, max_tokens=24)
    want = reference(model, requests)
    eng = engine(model, num_gpu_blocks=16, num_host_blocks=48, caching=False,
                 budget=32, preemption=mode)
    got = run_checked(eng, requests)
    assert_same(got, want)
    assert eng.scheduler.num_preemptions[PreemptMode(mode)] > 0
    assert sum(o.stats.preemptions for o in got) == sum(eng.scheduler.num_preemptions.values())
    if mode == "swap":
        assert eng.counters.swapped_in_bytes == eng.counters.swapped_out_bytes > 0


def test_host_tier_promotion_matches_no_cache(model: LlamaForCausalLM) -> None:
    requests = make_requests(6, 4, prefix_len=3 * BS + 2, max_tokens=24)
    eng = engine(model, num_gpu_blocks=16, num_host_blocks=64, budget=32, preemption="swap")
    run_checked(eng, requests)
    assert eng.scheduler.num_preemptions[PreemptMode.SWAP] > 0  # swapped blocks are host-cached
    # Unrelated traffic that needs the whole gpu pool evicts every cached gpu block.
    filler = Request(RequestId("filler"), tuple(range(100, 100 + 15 * BS)), SamplingParams(max_tokens=BS))
    run_checked(eng, [filler])
    again = [Request(RequestId(f"again-{r.request_id}"), r.prompt_token_ids, r.sampling) for r in requests]
    want = reference(model, again)
    got = run_checked(eng, again)
    assert_same(got, want)
    assert sum(o.stats.sources.local_host for o in got) > 0
    assert eng.counters.promoted_blocks > 0


@pytest.mark.parametrize("demote", [True, False])
def test_evicted_prefix_demoted_to_host_is_served_from_host(model: LlamaForCausalLM, demote: bool) -> None:
    requests = make_requests(7, 3, prefix_len=3 * BS + 2, max_tokens=8)
    eng = engine(model, num_gpu_blocks=16, num_host_blocks=64, demote=demote)
    for r in requests:  # one at a time: nothing is preempted, so nothing reaches the host by swapping
        run_checked(eng, [r])
    prefix = hash_blocks(requests[0].prompt_token_ids[: 3 * BS], BS)
    assert eng.memory.cached_prefix(Tier.GPU, prefix) == 3
    # Unrelated traffic that needs the whole gpu pool evicts every cached gpu block.
    filler = Request(RequestId("filler"), tuple(range(100, 100 + 15 * BS)), SamplingParams(max_tokens=BS))
    run_checked(eng, [filler])
    assert eng.memory.cached_prefix(Tier.GPU, prefix) == 0
    assert sum(eng.scheduler.num_preemptions.values()) == 0 and eng.counters.swapped_out_bytes == 0
    assert eng.memory.cached_prefix(Tier.HOST, prefix) == (3 if demote else 0)
    assert (eng.counters.demoted_blocks > 0) is demote
    again = [Request(RequestId(f"again-{r.request_id}"), r.prompt_token_ids, r.sampling) for r in requests]
    got = run_checked(eng, again)
    assert_same(got, reference(model, again))
    host_tokens = [o.stats.sources.local_host for o in got]
    if demote:
        # Every full prompt block (short of the last token, which is always computed) comes back:
        # from the host for the first request, from the host or the gpu (where an earlier request
        # promoted it) for the others.
        reusable = [(o.stats.prompt_tokens - 1) // BS * BS for o in got]
        assert host_tokens[0] == reusable[0]
        assert [o.stats.sources.local_gpu + o.stats.sources.local_host for o in got] == reusable
    else:
        assert host_tokens == [0, 0, 0]
    assert eng.stats().engine_cached_tokens["local_host"] == sum(o.stats.sources.local_host for o in got)
    assert (eng.counters.promoted_blocks > 0) is demote
