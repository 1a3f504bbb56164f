"""Where an agent publishes its KV events: the endpoint's forms, the replay socket beside it, loopback
unless remote is allowed (issue 38 item 4), no abstract ipc sockets, ipc only in a private folder, and
the deployment's per-agent endpoint."""

from pathlib import Path

import pytest
from click.testing import CliRunner

from radixmesh.cluster.cli.main import main
from radixmesh.cluster.launch.config import LauncherConfig
from radixmesh.node_agent.config import AgentConfig
from radixmesh.node_agent.kv_events.endpoint import check_endpoint, replay_endpoint
from radixmesh.node_agent.kv_events.publisher import ZmqKVEventPublisher
from radixmesh.node_agent.kv_events.token_book import TokenBook
from radixmesh.proto.ids import NodeId
from tests.support.tiny_model import BS

pytestmark = pytest.mark.anyio


def test_the_replay_socket_sits_beside_the_pub_socket() -> None:
    assert replay_endpoint("tcp://127.0.0.1:5557") == "tcp://127.0.0.1:5558"
    assert replay_endpoint("tcp://[::1]:5557") == "tcp://[::1]:5558"
    assert replay_endpoint("tcp://127.0.0.1:0") == "tcp://127.0.0.1:0"
    assert replay_endpoint("ipc:///tmp/agent-0") == "ipc:///tmp/agent-0.replay"


@pytest.mark.parametrize(("endpoint", "error"), [
    ("127.0.0.1:5557", "tcp://host:port or ipc://path"),
    ("http://127.0.0.1:5557", "tcp://host:port or ipc://path"),
    ("tcp://127.0.0.1", "tcp://host:port"),
    ("tcp://127.0.0.1:65535", r"\[0, 65534\]"),
    ("tcp://0.0.0.0:5557", "--kv-events-allow-remote"),
    ("tcp://*:5557", "--kv-events-allow-remote"),
    ("tcp://10.1.2.3:5557", "--kv-events-allow-remote"),
])
def test_a_bad_endpoint_is_refused_by_the_config(endpoint: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        AgentConfig(NodeId("a"), kv_events_endpoint=endpoint)


def test_remote_endpoints_only_when_allowed() -> None:
    check_endpoint("tcp://10.1.2.3:5557", allow_remote=True)
    check_endpoint("tcp://localhost:5557")
    check_endpoint("ipc:///tmp/x")
    assert AgentConfig(NodeId("a"), kv_events_endpoint="tcp://0.0.0.0:5557",
                       kv_events_allow_remote=True).kv_events_endpoint == "tcp://0.0.0.0:5557"


def test_the_deployment_gives_each_agent_its_endpoint() -> None:
    config = LauncherConfig(local_nodes=2, kv_events_endpoint="ipc:///tmp/radixmesh-kv-{node}")
    agent = config.agent_config(NodeId("node-1"), "127.0.0.1:1", "127.0.0.1")
    assert (agent.kv_events_endpoint, agent.kv_events_allow_remote) == ("ipc:///tmp/radixmesh-kv-node-1", False)
    assert LauncherConfig().agent_config(NodeId("node-0"), "127.0.0.1:1", "127.0.0.1").kv_events_endpoint is None


def test_up_refuses_a_remote_endpoint_unless_allowed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RADIXMESH_HOME", str(tmp_path))
    result = CliRunner().invoke(main, ["up", "--local", "1", "--kv-events-endpoint", "tcp://0.0.0.0:5557"])
    assert result.exit_code == 2 and "needs --kv-events-allow-remote" in result.output
    assert not (tmp_path / "cluster.json").exists()
    allowed = LauncherConfig(kv_events_endpoint="tcp://0.0.0.0:5557", kv_events_allow_remote=True)
    assert allowed.agent_config(NodeId("node-0"), "127.0.0.1:1", "10.0.0.1").kv_events_allow_remote


@pytest.mark.parametrize("endpoint", ["ipc://@radixmesh-kv", "ipc://@"])
def test_an_abstract_ipc_socket_is_refused(endpoint: str) -> None:
    """Issue 38 item 4: an abstract socket has no file, so no permission keeps other users out."""
    with pytest.raises(ValueError, match="abstract"):
        AgentConfig(NodeId("a"), kv_events_endpoint=endpoint)


async def test_an_ipc_socket_in_a_folder_others_can_enter_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o755)
    with pytest.raises(ValueError, match="0700"):
        await ZmqKVEventPublisher(f"ipc://{shared}/kv", TokenBook(BS)).start()
    assert list(shared.iterdir()) == []  # nothing was bound
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    publisher = ZmqKVEventPublisher(f"ipc://{private}/kv", TokenBook(BS))
    await publisher.start()
    await publisher.stop()
