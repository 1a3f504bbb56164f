"""`radixmesh sim` runs what `radixmesh up` runs unless told otherwise: SimConfig's defaults against the
deployment the launcher builds, the options that change them, and the configuration the report names."""

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from radixmesh.cluster.cli.sim import sim
from radixmesh.cluster.launch.config import LauncherConfig
from radixmesh.cluster.metadata.service_config import ServiceConfig
from radixmesh.cluster.sim.config import SimConfig
from radixmesh.common.block_pool.config import PoolHooks
from radixmesh.common.block_pool.eviction import EVICTION_ORDERS
from radixmesh.node_agent import node_setup
from radixmesh.node_agent.agent import NodeAgent
from radixmesh.proto.ids import NodeId
from tests.support.tiny_model import SOURCE

UP = SimConfig(nodes=2, capacity_blocks=8)
"""What the simulator runs when told nothing but the cluster's size."""


def _up_agent() -> Any:
    return LauncherConfig().agent_config(NodeId("node-0"), "127.0.0.1:1", "127.0.0.1")


def test_the_simulator_defaults_to_the_deployment_up_builds() -> None:
    launcher = LauncherConfig()
    agent = _up_agent()
    router = launcher.router_config("layout", block_bytes=4096)
    service = ServiceConfig()  # the metadata actor's: only its lease TTL is set from the launcher
    assert UP.eviction == agent.engine.memory.pool.eviction
    assert UP.cluster_recall == (agent.recall_blocks > 0 and service.recall_blocks > 0)
    assert UP.handoff == agent.handoff
    assert UP.policy == router.policy
    # The router narrows to holders + least loaded only on its index replica (Match scores everyone).
    assert UP.candidates == (router.least_loaded_candidates if router.index_replica else 0)
    assert UP.pending_ttl_s == router.pending_ttl_s
    for name in ("load_eps", "load_floor_s", "load_half_life_s"):
        assert getattr(UP, name) == getattr(router.policy_config, name), name
    assert UP.routers == 1  # `up` starts one router actor


@pytest.mark.anyio
async def test_an_agent_of_up_builds_its_pool_as_the_simulator_runs_its_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the agent hands its gpu pool (PoolHooks): the eviction order, the cluster's recall, and no
    cluster-aware eviction, which no agent setting turns on."""
    built: list[PoolHooks | None] = []
    engine = node_setup.Engine

    def recording_engine(*args: Any, gpu_hooks: PoolHooks | None = None, **kw: Any) -> Any:
        built.append(gpu_hooks)
        return engine(*args, gpu_hooks=gpu_hooks, **kw)

    monkeypatch.setattr(node_setup, "Engine", recording_engine)
    # The tiny model, no transfer plane and no metadata service, so the agent starts in-process.
    config = dataclasses.replace(_up_agent(), model=SOURCE, transfer="none", metadata_address=None)
    agent = NodeAgent(config)
    await agent.start()
    try:
        pool = agent.memory.gpu.pool  # the live pool: that `up`'s settings reached it is what this checks
    finally:
        await agent.stop()
    [hooks] = built
    assert pool.config.eviction == UP.eviction
    assert (hooks is not None and hooks.recalled is not None) == UP.cluster_recall
    assert (hooks is not None and hooks.copies_elsewhere is not None) == UP.cluster_eviction


def _trace_file(tmp_path: Path) -> str:
    p = tmp_path / "t.jsonl"
    rows = [(0, [0, 1, 2]), (100, [0, 1, 3]), (200, [0, 1, 2])]
    p.write_text("".join(json.dumps({"timestamp": t, "input_length": 512 * len(ids), "output_length": 1,
                                     "hash_ids": ids}) + "\n" for t, ids in rows))
    return str(p)


def _run(tmp_path: Path, *args: str) -> dict[str, Any]:
    out = CliRunner().invoke(sim, [_trace_file(tmp_path), "--nodes", "2", "--capacity", "8", "--json", *args])
    assert out.exit_code == 0, out.output
    config: dict[str, Any] = json.loads(out.output)["config"]
    return config


def test_without_options_the_report_names_the_up_configuration(tmp_path: Path) -> None:
    assert _run(tmp_path) == UP.as_dict()
    table = CliRunner().invoke(sim, [_trace_file(tmp_path), "--nodes", "2", "--capacity", "8"])
    assert table.exit_code == 0, table.output
    on = {True: "on", False: "off"}
    assert (f"configuration   eviction {UP.eviction}, recall {on[UP.cluster_recall]}, handoff {on[UP.handoff]}, "
            f"cluster eviction {on[UP.cluster_eviction]}\n") in table.output
    assert f"  routing       candidates holders + {UP.candidates} least loaded, 1 router(s), " in table.output


def _other_eviction() -> str:
    return next(order for order in sorted(EVICTION_ORDERS) if order != UP.eviction)


def _flag(name: str, on: bool) -> str:
    return f"--{name}" if on else f"--no-{name}"


OPTIONS: list[tuple[list[str], dict[str, object]]] = [
    (["--policy", "round_robin"], {"policy": "round_robin"}),
    (["--eviction", _other_eviction()], {"eviction": _other_eviction()}),
    ([_flag("recall", not UP.cluster_recall)], {"cluster_recall": not UP.cluster_recall}),
    ([_flag("handoff", not UP.handoff)], {"handoff": not UP.handoff}),
    ([_flag("cluster-eviction", not UP.cluster_eviction)], {"cluster_eviction": not UP.cluster_eviction}),
    (["--eviction-window", str(UP.eviction_window + 1)], {"eviction_window": UP.eviction_window + 1}),
    (["--candidates", str(UP.candidates + 1)], {"candidates": UP.candidates + 1}),
    (["--prefill-rate", "1000"], {"prefill_tokens_per_s": 1000.0}),
    (["--pull-gbps", "2.5"], {"pull_bytes_per_s": 2.5e9}),
]


@pytest.mark.parametrize(("args", "changed"), OPTIONS, ids=[args[0] for args, _ in OPTIONS])
def test_each_option_changes_the_configuration_that_ran(tmp_path: Path, args: list[str],
                                                         changed: dict[str, object]) -> None:
    assert _run(tmp_path, *args) == UP.as_dict() | changed


def test_the_table_names_what_the_options_changed(tmp_path: Path) -> None:
    args = ["--eviction", "lru", "--no-recall", "--handoff", "--cluster-eviction", "--eviction-window", "3",
            "--candidates", "0"]
    out = CliRunner().invoke(sim, [_trace_file(tmp_path), "--nodes", "2", "--capacity", "8", *args])
    assert out.exit_code == 0, out.output
    assert ("configuration   eviction lru, recall off, handoff on, cluster eviction on (window 3)\n"
            "  routing       candidates every node, ") in out.output


def test_help_shows_the_up_defaults() -> None:
    out = CliRunner().invoke(sim, ["--help"])
    assert out.exit_code == 0
    # Through the group, each option also names its variable (`[env var: RADIXMESH_SIM_EVICTION; default: ...]`).
    text = re.sub(r"env var: \S+; ", "", " ".join(out.output.split()))
    assert f"--eviction [{'|'.join(sorted(EVICTION_ORDERS))}]" in text
    assert f"[default: {UP.eviction}]" in text and f"[default: {UP.candidates}; x>=0]" in text
    assert f"[default: {'recall' if UP.cluster_recall else 'no-recall'}]" in text


@pytest.mark.parametrize(("args", "names"), [
    (["--eviction", "fifo"], "--eviction"),
    (["--candidates", "-1"], "--candidates"),
    (["--eviction-window", "-1"], "--eviction-window"),
    (["--recall=yes"], "--recall"),
    (["--prefill-rate", "0"], "prefill_tokens_per_s"),
])
def test_bad_values_are_usage_errors(tmp_path: Path, args: list[str], names: str) -> None:
    out = CliRunner().invoke(sim, [_trace_file(tmp_path), *args])
    assert out.exit_code == 2 and names in out.output, out.output
