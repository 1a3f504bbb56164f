"""KV events out carry no token ids and no cache salt unless asked (issue 38, item 4): by default a
subscriber learns which blocks a real agent holds and where (hashes, parents, media), never the
prompts; radixmesh's own ingest, which rebuilds our digests from tokens, then indexes nothing (and
counts why), which is why it takes `kv_events_token_ids` (`up --kv-events-token-ids`)."""

import pytest

from radixmesh.cluster.launch.config import LauncherConfig
from radixmesh.node_agent.config import AgentConfig
from radixmesh.proto.ids import NodeId
from radixmesh.proto.vllm_kv_events import VllmBlockStored, decode_batch
from tests.node_agent.kv_events.test_kv_events_out import holdings, ingesting, publishing_agent
from tests.support.agents import collect, plan, prompt
from tests.support.poll import until

pytestmark = [pytest.mark.anyio, pytest.mark.integration]


def test_token_ids_are_off_unless_asked() -> None:
    assert not AgentConfig(NodeId("a")).kv_events_token_ids
    launcher = LauncherConfig(kv_events_endpoint="tcp://127.0.0.1:0")
    assert not launcher.agent_config(NodeId("a"), "", "127.0.0.1").kv_events_token_ids
    on = LauncherConfig(kv_events_endpoint="tcp://127.0.0.1:0", kv_events_token_ids=True)
    assert on.agent_config(NodeId("a"), "", "127.0.0.1").kv_events_token_ids


async def test_by_default_the_events_name_blocks_and_never_prompts_or_salts() -> None:
    async with publishing_agent(gpu_blocks=12, host_blocks=64, token_ids=False) as (agent, publisher), \
            ingesting(publisher) as ingest:
        tokens = prompt(5, 18)
        await collect(agent.serve(plan("salted", tokens, max_tokens=7, tenant="acme")))
        held = await holdings(agent)
        await until(lambda: ingest.subscriber.last_seq == publisher.published - 1, "every batch")
        frames = await ingest.frames()
    stored = [e for f in frames for e in decode_batch(f[2]).events if isinstance(e, VllmBlockStored)]
    assert sum(len(e.block_hashes) for e in stored) >= len(held) > 0  # every held block is named
    assert all(e.token_ids == () and e.extra_keys is None for e in stored)
    assert all(e.medium in ("GPU", "CPU") for e in stored)
    # Our ingest rebuilds digests from tokens: without them it indexes nothing, and says why.
    assert ingest.held() == set() and ingest.map.skipped.get("malformed", 0) > 0
