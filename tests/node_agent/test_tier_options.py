"""`radixmesh up`'s tier options reach every agent's memory: the command line, the environment
(RADIXMESH_UP_...) and a --config file all land in the AgentConfig the launcher builds."""

from pathlib import Path

import pytest
from click.testing import CliRunner

from radixmesh.cluster.cli import cluster as cluster_cli
from radixmesh.cluster.cli.main import main
from radixmesh.cluster.launch.config import LauncherConfig
from radixmesh.proto.ids import NodeId


class _Started(Exception):
    """Raised by the stand-in for Ray's start: the config is captured, nothing is launched."""


@pytest.fixture
def launched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[LauncherConfig]:
    monkeypatch.setenv("RADIXMESH_HOME", str(tmp_path))
    configs: list[LauncherConfig] = []

    def capture(config: LauncherConfig) -> None:
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


@pytest.mark.parametrize("args, message", [
    (["--disk-cache", "kv"], "a disk tier (disk_cache) needs a host tier (num_host_blocks > 0)"),
    (["--disk-cache", "kv", "--host-blocks", "8", "--disk-cache-gb", "0.1"], "disk capacity must hold 2 segments"),
    (["--disk-cache-gb", "0"], "0 is not in the range x>0"),
])
def test_a_disk_tier_it_cannot_run_is_refused(launched: list[LauncherConfig], args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, ["up", "--local", "1", *args])
    assert result.exit_code == 2 and message in result.output and not launched
