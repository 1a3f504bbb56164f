"""The contract types every layer shares: tokens by source, prompt limits, reusable blocks, seeds."""

import random

import pytest

from radixmesh.proto.serve.limits import InvalidRequest, PromptLimits, usable_prefix_blocks
from radixmesh.proto.serve.sampling import MAX_SEED, SamplingParams, draw_seed
from radixmesh.proto.serve.tokens import HIT_SOURCES, SOURCES, TokenSources


def test_token_sources_sum_to_the_prompt() -> None:
    t = TokenSources.of_prompt(40, local_gpu=16, local_host=8, local_disk=2, remote=4)
    assert (t.computed, t.prompt, t.hits, t.local) == (10, 40, 30, 26)
    assert t.items() == [("local_gpu", 16), ("local_host", 8), ("local_disk", 2), ("remote", 4), ("computed", 10)]
    assert t + t == TokenSources(32, 16, 8, 20, local_disk=4)
    assert SOURCES == ("local_gpu", "local_host", "local_disk", "remote", "computed") and HIT_SOURCES == SOURCES[:4]


def test_positional_token_sources_keep_their_meaning() -> None:
    """local_disk is keyword-only: (gpu, host, remote, computed) positionally, as before it existed."""
    assert TokenSources(1, 2, 3, 4) == TokenSources(local_gpu=1, local_host=2, remote=3, computed=4)


def test_token_sources_refuse_hits_beyond_the_prompt_and_negative_counts() -> None:
    with pytest.raises(ValueError, match="exceed the prompt"):
        TokenSources.of_prompt(10, local_gpu=8, remote=4)
    with pytest.raises(ValueError, match="non-negative"):
        TokenSources(local_gpu=-1)
    with pytest.raises(ValueError, match="non-negative"):
        TokenSources(local_disk=-1)


@pytest.mark.parametrize(("prompt", "max_tokens", "match"), [
    ((), 1, "empty"),
    ((1, 300), 1, "outside the vocabulary"),
    ((1, -1), 1, "outside the vocabulary"),
    ((1, 2.0), 1, "outside the vocabulary"),
    (tuple(range(10)), 7, "exceeds the context limit of 16"),
])
def test_prompt_limits_name_what_is_wrong(prompt: tuple[int, ...], max_tokens: int, match: str) -> None:
    with pytest.raises(InvalidRequest, match=match):
        PromptLimits(vocab_size=258, max_context_tokens=16).check(prompt, max_tokens)  # type: ignore[arg-type]


def test_prompt_limits_accept_a_prompt_that_just_fits() -> None:
    PromptLimits(vocab_size=258, max_context_tokens=16).check(tuple(range(10)), 6)


@pytest.mark.parametrize(("tokens", "bs", "blocks"), [(0, 4, 0), (1, 4, 0), (4, 4, 0), (5, 4, 1), (8, 4, 1),
                                                      (9, 4, 2), (33, 16, 2), (32, 16, 1)])
def test_the_block_holding_the_last_token_is_never_reusable(tokens: int, bs: int, blocks: int) -> None:
    assert usable_prefix_blocks(tokens, bs) == blocks


def test_seeds_are_bounded_and_drawn_in_range() -> None:
    assert SamplingParams(seed=MAX_SEED).seed == MAX_SEED
    with pytest.raises(ValueError, match="seed"):
        SamplingParams(seed=MAX_SEED + 1)
    rng = random.Random(0)
    assert all(0 <= draw_seed(rng) <= MAX_SEED for _ in range(100))
