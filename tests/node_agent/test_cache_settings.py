"""Operators choose each agent's eviction order and hand-off: the CLI options, the deployment's
config, and what a running agent exports."""

from pathlib import Path

import pytest
from click.testing import CliRunner

from radixmesh.cluster.cli.main import main
from radixmesh.cluster.launch.config import LauncherConfig
from radixmesh.common.block_pool.config import PoolConfig
from radixmesh.common.block_pool.eviction import DEFAULT_EVICTION, DEFAULT_HANDOFF
from radixmesh.node_agent.agent import NodeAgent
from radixmesh.node_agent.config import AgentConfig
from radixmesh.node_agent.engine.config import EngineConfig
from radixmesh.node_agent.memory.config import MemoryConfig
from radixmesh.proto.ids import NodeId
from tests.support.agents import SECRET
from tests.support.tiny_model import BS, SOURCE

TRACE = Path(__file__).resolve().parents[1] / "data" / "traces" / "mooncake_trace_1000.jsonl"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RADIXMESH_HOME", str(tmp_path))
    return tmp_path


@pytest.mark.parametrize("args", [
    ["up", "--local", "1", "--eviction", "mru"],
    ["demo", "--eviction", "mru"],
    ["replay", str(TRACE), "--local", "1", "--eviction", "mru"],
])
def test_an_unknown_eviction_order_is_a_usage_error(home: Path, args: list[str]) -> None:
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2
    # click names the option's variable too (RADIXMESH_UP_EVICTION...): the value may have come from it.
    assert "Invalid value for '--eviction' (env var: 'RADIXMESH_" in result.output
    assert "'mru' is not one of 'adaptive', 'lru', 's3fifo'" in result.output
    assert not (home / "cluster.json").exists()


def test_replay_of_a_running_deployment_refuses_agent_settings(home: Path) -> None:
    for option in (["--handoff"], ["--no-handoff"], ["--eviction", "lru"]):  # given either way, not the value
        result = CliRunner().invoke(main, ["replay", str(TRACE), "--url", "http://127.0.0.1:9", *option])
        assert result.exit_code == 2 and "a running deployment keeps the ones it was started with" in result.output


def test_the_deployment_hands_its_cache_settings_to_every_agent() -> None:
    config = LauncherConfig(local_nodes=2, eviction="lru", handoff=not DEFAULT_HANDOFF)
    agent = config.agent_config(NodeId("node-1"), "127.0.0.1:1", "127.0.0.1")
    assert (agent.engine.memory.pool.eviction, agent.handoff) == ("lru", not DEFAULT_HANDOFF)
    default = LauncherConfig().agent_config(NodeId("node-0"), "127.0.0.1:1", "127.0.0.1")
    assert (default.engine.memory.pool.eviction, default.handoff) == (DEFAULT_EVICTION, DEFAULT_HANDOFF)


def test_a_deployment_with_an_unknown_order_is_refused() -> None:
    with pytest.raises(ValueError, match="eviction must be one of adaptive, lru, s3fifo, got 'mru'"):
        LauncherConfig(eviction="mru")


@pytest.mark.anyio
async def test_an_agent_exports_its_eviction_order_and_hand_off() -> None:
    memory = MemoryConfig(num_gpu_blocks=16, pool=PoolConfig(eviction="s3fifo"))
    agent = NodeAgent(AgentConfig(NodeId("a"), model=SOURCE, engine=EngineConfig(block_size=BS, memory=memory),
                                  transfer="none", secret=SECRET, handoff=True))
    await agent.start()
    try:
        text = await agent.prometheus_text()
    finally:
        await agent.stop()
    labels = f'model_name="{agent.config.model_name}",node="a"'
    assert f'radixmesh_agent_eviction_order{{{labels},order="s3fifo"}} 1' in text
    assert 'order="lru"' not in text
    assert f"radixmesh_agent_handoff{{{labels}}} 1" in text
