"""`radixmesh up`'s tier options reach every agent's memory: the command line, the environment
(RADIXMESH_UP_...) and a --config file all land in the AgentConfig the launcher builds."""

from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from radixmesh.cluster.cli import up_down as cluster_cli
from radixmesh.cluster.cli.main import main
from radixmesh.cluster.launch.config import LauncherConfig
from radixmesh.node_agent.agent import NodeAgent
from radixmesh.node_agent.memory.config import STAGING_HOST_BLOCKS
from radixmesh.proto.events import Tier
from radixmesh.proto.ids import NodeId
from tests.support.agents import agent_config


class _Started(Exception):
    """Raised by the stand-in for Ray's start: the config is captured, nothing is launched."""


@pytest.fixture
def launched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[LauncherConfig]:
    monkeypatch.setenv("RADIXMESH_HOME", str(tmp_path))
    configs: list[LauncherConfig] = []

    def capture(config: LauncherConfig, **_: object) -> None:
        configs.append(config)
        raise _Started

    monkeypatch.setattr(cluster_cli.launcher, "init_local_ray", capture)
    return configs


def _memory_of(config: LauncherConfig) -> tuple[int, ...]:
    memory = config.agent_config(NodeId("node-0"), "127.0.0.1:1", "127.0.0.1").engine.memory
    return (memory.num_gpu_blocks, memory.num_host_blocks)


def test_host_blocks_from_the_command_line(launched: list[LauncherConfig]) -> None:
    result = CliRunner().invoke(main, ["up", "--local", "1", "--gpu-blocks", "64", "--host-blocks", "256"])
    assert isinstance(result.exception, _Started)
    assert _memory_of(launched[0]) == (64, 256)


def test_host_blocks_from_the_environment(launched: list[LauncherConfig], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RADIXMESH_UP_HOST_BLOCKS", "512")
    result = CliRunner().invoke(main, ["up", "--local", "1"])
    assert isinstance(result.exception, _Started)
    assert _memory_of(launched[0]) == (1024, 512)


def test_host_blocks_from_a_config_file(launched: list[LauncherConfig], tmp_path: Path) -> None:
    config = tmp_path / "radixmesh.yaml"
    config.write_text("up:\n  host-blocks: 128\n")
    result = CliRunner().invoke(main, ["--config", str(config), "up", "--local", "1"])
    assert isinstance(result.exception, _Started)
    assert _memory_of(launched[0]) == (1024, 128)


def test_no_host_tier_by_default_and_a_negative_size_is_refused(launched: list[LauncherConfig]) -> None:
    assert isinstance(CliRunner().invoke(main, ["up", "--local", "1"]).exception, _Started)
    assert _memory_of(launched[0]) == (1024, 0)
    refused = CliRunner().invoke(main, ["up", "--local", "1", "--host-blocks", "-1"])
    assert refused.exit_code == 2 and "-1 is not in the range x>=0" in refused.output and len(launched) == 1


def test_disk_cache_gives_each_agent_its_own_directory(launched: list[LauncherConfig], tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RADIXMESH_UP_DISK_CACHE", str(tmp_path / "kv"))
    result = CliRunner().invoke(main, ["up", "--local", "2", "--host-blocks", "64", "--disk-cache-gb", "0.5"])
    assert isinstance(result.exception, _Started)
    disks = [launched[0].agent_config(node, "127.0.0.1:1", "127.0.0.1").disk for node in launched[0].node_ids(2)]
    assert [(d.path, d.capacity_bytes) for d in disks if d] == [(tmp_path / "kv" / "node-0", 1 << 29),
                                                               (tmp_path / "kv" / "node-1", 1 << 29)]


def test_a_disk_tier_without_host_blocks_gets_a_staging_host_tier(launched: list[LauncherConfig],
                                                                  tmp_path: Path) -> None:
    """Issue 40: `--disk-cache` alone was refused; users had to size a host tier to stage disk reads."""
    result = CliRunner().invoke(main, ["up", "--local", "1", "--disk-cache", str(tmp_path / "kv")])
    assert isinstance(result.exception, _Started)
    agent = launched[0].agent_config(NodeId("node-0"), "127.0.0.1:1", "127.0.0.1")
    assert agent.disk is not None
    memory = replace(agent.engine.memory, disk=agent.disk)  # as the agent builds its engine
    assert (memory.num_host_blocks, memory.host_blocks) == (0, STAGING_HOST_BLOCKS)


@pytest.mark.parametrize("args, message", [    (["--disk-cache", "kv", "--host-blocks", "8", "--disk-cache-gb", "0.1"], "disk capacity must hold 2 segments"),
    (["--disk-cache-gb", "0"], "0 is not in the range x>0"),
])
def test_a_disk_tier_it_cannot_run_is_refused(launched: list[LauncherConfig], args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, ["up", "--local", "1", *args])
    assert result.exit_code == 2 and message in result.output and not launched


def test_host_cache_takes_a_size_that_each_agent_turns_into_blocks(launched: list[LauncherConfig]) -> None:
    """Issue 40: tiers were sized in blocks only; SGLang and LMCache take GB."""
    result = CliRunner().invoke(main, ["up", "--local", "1", "--host-cache", "4GiB"])
    assert isinstance(result.exception, _Started)
    agent = launched[0].agent_config(NodeId("node-0"), "127.0.0.1:1", "127.0.0.1")
    assert (agent.host_cache_bytes, agent.engine.memory.num_host_blocks) == (4 << 30, 0)
    assert agent.host_blocks_of(2 << 20) == 2048  # Llama-3-8B's 2 MiB blocks
    with pytest.raises(ValueError, match="holds no block of this model's 8589934592 bytes"):
        agent.host_blocks_of(8 << 30)


@pytest.mark.parametrize("size, message", [
    ("4", "'4' is not a size: write a number and a unit, e.g. 4GiB"),
    ("4 gigs", "'4 gigs' is not a size"),
    ("-1GiB", "'-1GiB' is not a size"),
    ("0GiB", "'0GiB' is less than one byte"),
    ("nanGiB", "'nanGiB' is not a size"),
])
def test_a_bad_host_cache_size_is_refused_in_one_line(launched: list[LauncherConfig], size: str, message: str) -> None:
    result = CliRunner().invoke(main, ["up", "--local", "1", "--host-cache", size])
    assert result.exit_code == 2 and message in result.output and not launched


@pytest.mark.parametrize("size, expected", [("512MiB", 512 << 20), ("1.5GB", 1_500_000_000), ("2gib", 2 << 30),
                                            (" 64 KiB ", 64 << 10)])
def test_sizes_in_binary_and_decimal_units(launched: list[LauncherConfig], size: str, expected: int) -> None:
    assert isinstance(CliRunner().invoke(main, ["up", "--local", "1", "--host-cache", size]).exception, _Started)
    assert launched[0].host_cache_bytes == expected


def test_host_cache_and_host_blocks_together_are_refused(launched: list[LauncherConfig]) -> None:
    result = CliRunner().invoke(main, ["up", "--local", "1", "--host-cache", "1GiB", "--host-blocks", "8"])
    assert result.exit_code == 2 and "both size the host tier" in result.output and not launched


@pytest.mark.anyio
async def test_an_agent_sizes_its_host_tier_from_bytes_with_its_models_block_bytes() -> None:
    agent = NodeAgent(agent_config("a", host_cache_bytes=1 << 20))
    await agent.start()
    try:
        block_bytes = agent.layout.block_bytes
        assert sum(agent.memory.block_counts(Tier.HOST)) == (1 << 20) // block_bytes  # every state: the size
    finally:
        await agent.stop()
    too_small = NodeAgent(agent_config("b", host_cache_bytes=block_bytes - 1))
    with pytest.raises(ValueError, match=f"holds no block of this model's {block_bytes} bytes"):
        await too_small.start()
