"""The bench's split arms (issue 37): the cost policy over the same agents split into prefill and
decode agents, run only when named, on fresh local clusters only."""

import pytest
from click.testing import CliRunner

from radixmesh.cluster.bench.arms import ARMS, DEFAULT_ARMS, LocalClusters
from radixmesh.cluster.cli.main import main
from radixmesh.cluster.launch.config import LauncherConfig


def test_a_split_arm_splits_the_same_agents() -> None:
    clusters = LocalClusters(LauncherConfig(local_nodes=4))
    one, half = clusters.config(ARMS["split_1p"]), clusters.config(ARMS["split_half"])
    assert (one.policy, one.prefill_nodes, one.decode_nodes) == ("cost", 1, 3)
    assert (half.prefill_nodes, half.decode_nodes, half.local_nodes) == (2, 2, 4)
    assert clusters.config(ARMS["cost"]).prefill_nodes == 0


def test_split_arms_run_only_when_named() -> None:
    assert "split_1p" not in DEFAULT_ARMS and "split_half" not in DEFAULT_ARMS and "cost" in DEFAULT_ARMS


@pytest.mark.parametrize(("args", "said"), [
    (["--local", "1", "--arms", "cost,split_1p"], "needs at least 2 agents"),
    (["--url", "http://127.0.0.1:1", "--arms", "split_half"], "not of a running deployment"),
])
def test_a_split_arm_that_cannot_run_is_refused_before_anything_starts(args: list[str], said: str) -> None:
    result = CliRunner().invoke(main, ["bench", *args])
    assert result.exit_code == 2 and said in result.output, result.output
