"""Roles of a prefill/decode split (issue 37): which agents of a local deployment prefill and which
decode, carried in each agent's registration (NodeInfo.role, across the wire too) to the router's
directory."""

import pytest

from radixmesh.cluster.fleet.agent_client import StaticAgentDirectory
from radixmesh.cluster.launch.config import LauncherConfig
from radixmesh.cluster.launch.reconcile import (
    AGENT_RESOURCE,
    ROLE_RESOURCES,
    node_role,
    node_slots,
    simulated_slots,
)
from radixmesh.proto.ids import NodeId
from radixmesh.proto.metadata.codec import node_info_from_pb, node_info_to_pb
from radixmesh.proto.metadata.nodes import NodeInfo
from radixmesh.proto.radixmesh_pb2 import RegisterNodeRequest


def test_the_first_agents_prefill_and_the_last_decode() -> None:
    config = LauncherConfig(local_nodes=3, prefill_nodes=1, decode_nodes=2)
    roles = [config.agent_config(n, "", "127.0.0.1").role for n in config.node_ids(3)]
    assert roles == ["prefill", "decode", "decode"]


def test_without_a_split_every_agent_does_both() -> None:
    config = LauncherConfig(local_nodes=2)
    assert [config.agent_config(n, "", "127.0.0.1").role for n in config.node_ids(2)] == ["both", "both"]


@pytest.mark.parametrize(("kw", "said"), [
    ({"local_nodes": 2, "prefill_nodes": 2, "decode_nodes": 0}, "at least one prefill and one decode"),
    ({"local_nodes": 3, "prefill_nodes": 1, "decode_nodes": 1}, "make 2, but local_nodes is 3"),
    ({"prefill_nodes": 1, "decode_nodes": 1}, "count simulated nodes"),
])
def test_a_split_that_cannot_be_placed_is_refused(kw: dict[str, int], said: str) -> None:
    with pytest.raises(ValueError, match=said):
        LauncherConfig(**kw)  # type: ignore[arg-type]


def test_the_role_crosses_the_wire_and_an_old_node_declares_both() -> None:
    info = NodeInfo(NodeId("n"), 1, "L", 16, 64, "127.0.0.1:1", 8, "decode")
    assert node_info_from_pb(node_info_to_pb(info)) == info
    old = RegisterNodeRequest(node_id="n", epoch=1, layout_fingerprint="L", block_size=16, block_bytes=64)
    assert node_info_from_pb(old).role == "both"
    with pytest.raises(ValueError, match="role must be one of both, prefill, decode"):
        node_info_from_pb(RegisterNodeRequest(node_id="n", epoch=1, layout_fingerprint="L", block_size=16,
                                              block_bytes=64, role="chef"))


def test_the_directory_knows_each_agents_role_until_it_leaves() -> None:
    class Client:
        def __init__(self, node: str) -> None:
            self.node = NodeId(node)

    directory = StaticAgentDirectory([])
    directory.add(Client("p"), "prefill")  # type: ignore[arg-type]
    directory.add(Client("x"))  # type: ignore[arg-type]
    assert (directory.role(NodeId("p")), directory.role(NodeId("x"))) == ("prefill", "both")
    directory.remove(NodeId("p"))
    assert directory.role(NodeId("p")) == "both" and directory.nodes() == ["x"]


def ray_node(ip: str, resources: dict[str, float]) -> dict[str, object]:
    return {"Alive": True, "NodeManagerAddress": ip, "Resources": {"CPU": 4.0, f"node:{ip}": 1.0, **resources}}


def test_a_ray_nodes_marker_resource_gives_its_agents_their_role() -> None:
    slots = node_slots([ray_node("10.0.0.1", {"GPU": 2, ROLE_RESOURCES["prefill"]: 1}),
                        ray_node("10.0.0.2", {"GPU": 1, ROLE_RESOURCES["decode"]: 1}),
                        ray_node("10.0.0.3", {AGENT_RESOURCE: 1})])
    assert [(s.node, s.role) for s in slots] == [("10.0.0.1-gpu0", "prefill"), ("10.0.0.1-gpu1", "prefill"),
                                                 ("10.0.0.2-gpu0", "decode"), ("10.0.0.3-cpu", "both")]
    with pytest.raises(ValueError, match="give it one role"):
        node_role({ROLE_RESOURCES["prefill"]: 1, ROLE_RESOURCES["decode"]: 1})


def test_simulated_slots_take_the_launchers_roles() -> None:
    config = LauncherConfig(local_nodes=2, prefill_nodes=1, decode_nodes=1)
    slots = simulated_slots(config.node_ids(2), "127.0.0.1", config.role_of)
    assert [s.role for s in slots] == ["prefill", "decode"]
