"""The bench's split arms (issue 37): the cost policy over the same agents split into prefill and
decode agents (split_<P>p, split_half), run only when named, on fresh local clusters only."""

import re

import pytest
from click.testing import CliRunner

from radixmesh.cluster.bench.arms import ARMS, DEFAULT_ARMS, LocalClusters, arm_named
from radixmesh.cluster.cli.bench import _arms
from radixmesh.cluster.cli.main import main
from radixmesh.cluster.launch.config import LauncherConfig


def test_a_split_arm_splits_the_same_agents() -> None:
    clusters = LocalClusters(LauncherConfig(local_nodes=4))
    one, half = clusters.config(ARMS["split_1p"]), clusters.config(ARMS["split_half"])
    assert (one.policy, one.prefill_nodes, one.decode_nodes) == ("cost", 1, 3)
    assert (half.prefill_nodes, half.decode_nodes, half.local_nodes) == (2, 2, 4)
    assert clusters.config(ARMS["cost"]).prefill_nodes == 0


@pytest.mark.parametrize(("name", "agents", "split"), [
    ("split_6p", 8, (6, 2)),
    ("split_7p", 8, (7, 1)),  # P = N - 1: one decode agent
    ("split_1p", 8, (1, 7)),
    ("split_2p", 3, (2, 1)),
])
def test_split_p_prefills_on_p_agents_and_decodes_on_the_rest(name: str, agents: int,
                                                              split: tuple[int, int]) -> None:
    arm = arm_named(name)
    assert (arm.name, arm.policy, arm.caching) == (name, "cost", True)
    config = LocalClusters(LauncherConfig(local_nodes=agents)).config(arm)
    assert (config.prefill_nodes, config.decode_nodes, config.local_nodes, config.policy) == (*split, agents, "cost")


def test_the_named_splits_are_what_split_p_and_half_say() -> None:
    assert arm_named("split_1p") == ARMS["split_1p"] and arm_named("split_half") == ARMS["split_half"]
    assert arm_named("split_01p") == ARMS["split_1p"]  # one arm, whatever the spelling of P
    assert [ARMS["split_half"].prefill_nodes(n) for n in (2, 3, 4, 8)] == [1, 1, 2, 4]


@pytest.mark.parametrize(("name", "agents", "said"), [
    ("split_8p", 8, "prefills on 8 of 8 agents: P of split_<P>p must be between 1 and 7"),
    ("split_9p", 8, "prefills on 9 of 8 agents"),
    ("split_1p", 1, "needs at least 2 agents, got 1"),
    ("split_half", 1, "needs at least 2 agents, got 1"),
])
def test_a_split_that_leaves_no_agent_to_decode_is_refused(name: str, agents: int, said: str) -> None:
    with pytest.raises(ValueError, match=re.escape(said)):
        arm_named(name).prefill_nodes(agents)


@pytest.mark.parametrize("name", ["split_p", "split_-1p", "split_2", "split_1.5p", "splt_2p", "split_quarter"])
def test_a_name_that_is_no_arm_names_the_valid_ones(name: str) -> None:
    with pytest.raises(ValueError, match=r"unknown arm .*valid: cost, .*split_half, split_<P>p"):
        arm_named(name)


def test_split_arms_run_only_when_named() -> None:
    assert "split_1p" not in DEFAULT_ARMS and "split_half" not in DEFAULT_ARMS and "cost" in DEFAULT_ARMS


@pytest.mark.parametrize(("args", "said"), [
    (["--local", "1", "--arms", "cost,split_1p"], "needs at least 2 agents"),
    (["--local", "8", "--arms", "cost,split_8p"], "P of split_<P>p must be between 1 and 7"),
    (["--local", "8", "--arms", "split_0p"], "P of split_<P>p must be between 1 and N - 1"),
    (["--local", "8", "--arms", "cost,split_sixp"], "unknown arm(s) split_sixp; valid: cost, "),
    (["--url", "http://127.0.0.1:1", "--arms", "split_half"], "not of a running deployment"),
    (["--url", "http://127.0.0.1:1", "--arms", "split_2p"], "not of a running deployment"),
])
def test_a_split_arm_that_cannot_run_is_refused_before_anything_starts(args: list[str], said: str) -> None:
    result = CliRunner().invoke(main, ["bench", *args])
    assert result.exit_code == 2 and said in result.output, result.output


def test_split_p_arms_are_parsed_once_each_beside_the_named_ones() -> None:
    arms = _arms(None, None, "cost, split_6p,split_half,split_06p")  # type: ignore[arg-type]
    assert [a.name for a in arms] == ["cost", "split_6p", "split_half"]
