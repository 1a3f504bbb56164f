"""The processes that only describe and place agents never load torch: the router actor, the metadata
actor and `radixmesh up` import no engine, and a launcher config (model source, modeled engine and
all) unpickles without it. Each such process was ~1.3 s of CPU and ~150 MB more for torch alone."""

import pickle
import subprocess
import sys
from dataclasses import replace

from radixmesh.cluster.launch.config import LauncherConfig
from radixmesh.node_agent import SMOLLM2, parse_engine, resolve_model

PROBE = """
import pickle, sys
config = pickle.loads(sys.stdin.buffer.read())
for module in sys.argv[1:]:
    __import__(module)
print(config.engine_label, "torch" in sys.modules)
"""
DESCRIBERS = ["radixmesh.cluster.launch.router_actor", "radixmesh.cluster.launch.metadata_actor",
              "radixmesh.cluster.cli.up_down", "radixmesh.cluster.launch.launcher"]


def loads_torch(config: LauncherConfig, modules: list[str]) -> bool:
    """Whether a fresh interpreter that unpickles `config` and imports `modules` has torch loaded."""
    run = subprocess.run([sys.executable, "-c", PROBE, *modules], input=pickle.dumps(config),
                         capture_output=True, check=True, timeout=120)
    label, torch_loaded = run.stdout.decode().split()
    assert label == config.engine_label
    return torch_loaded == "True"


def test_the_router_metadata_service_and_up_never_import_torch() -> None:
    modeled = LauncherConfig(local_nodes=2, modeled=parse_engine("modeled:h100-llama3-8b"))
    assert not loads_torch(modeled, DESCRIBERS)
    assert not loads_torch(replace(modeled, model=resolve_model(SMOLLM2), modeled=None), DESCRIBERS)


def test_the_probe_sees_torch_where_an_agent_runs() -> None:
    # The same probe, importing what an agent actor's process imports: torch is there, so the
    # assertions above could fail.
    assert loads_torch(LauncherConfig(local_nodes=1), ["radixmesh.node_agent.agent"])
