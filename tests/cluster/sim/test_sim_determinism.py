"""The simulator's figures and the index's snapshots do not depend on PYTHONHASHSEED.

Node ids are strings and block hashes bytes: a set of either iterates in an order that changes with
the interpreter's hash seed. Where such an order reaches routing (the candidates' order read by
round robin and random tie-breaks), a benchmark run twice reports different hit counts. Each child
process below runs the same multi-node simulations and snapshot under its own seed.
"""

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

TRACE = Path(__file__).parents[2] / "data" / "traces" / "chat.jsonl"

CHILD = """
import json, sys
from radixmesh.cluster.metadata.index import GlobalIndex
from radixmesh.cluster.sim.config import SimConfig
from radixmesh.cluster.sim.simulator import Simulator, prepare
from radixmesh.cluster.sim.trace import read_trace
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.events import Tier
from radixmesh.proto.ids import NodeId

requests = prepare(read_trace(sys.argv[1], limit=300))
out = {}
for policy, routers in (("cost", 1), ("cost", 2), ("round_robin", 1), ("least_loaded", 1)):
    config = SimConfig(nodes=4, capacity_blocks=9, policy=policy, routers=routers, check_every=100)
    report = Simulator(config).run(requests).as_dict()
    for wall_clock in ("match_us_mean", "route_us_mean"):
        del report[wall_clock]
    out[f"{policy} x{routers}"] = report

# A trunk with many branches: the snapshot's chain order is what a replica rebuilds from.
index, node = GlobalIndex(), NodeId("n0")
index.add_node(node, "l")
trunk = [BlockHash(bytes([1, i]) * 8) for i in range(6)]
index.insert(node, trunk, None, Tier.GPU)
for b in range(12):
    index.insert(node, [BlockHash(bytes([2, b, i]) * 8) for i in range(3)], trunk[b % 6], Tier.GPU)
out["chains"] = [([h.hex() for h in c.hashes], c.parent and c.parent.hex()) for c in index.node_chains(node)]
print(json.dumps(out, sort_keys=True))
"""


def run_with_hash_seed(seed: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONHASHSEED": str(seed)}
    done = subprocess.run([sys.executable, "-c", CHILD, str(TRACE)], env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


@pytest.mark.slow
def test_reports_and_snapshots_are_the_same_under_any_hash_seed() -> None:
    first = run_with_hash_seed(0)
    # Before the fix seeds 0 and 1 already gave different local hits (1119 against 1002 for cost).
    for seed in (1, 2):
        again = run_with_hash_seed(seed)
        for key, report in first.items():
            assert again[key] == report, f"{key} differs under PYTHONHASHSEED={seed}"
    assert sum(first["cost x1"]["hits_by_source"].values()) == first["cost x1"]["blocks"] > 0
