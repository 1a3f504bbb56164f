"""The compute group an agent heartbeats: agents on one machine and one core set share it, agents
pinned to other cores do not."""

import os
import socket
from pathlib import Path

import pytest
import torch

from radixmesh.node_agent import compute_group as cg


def test_agents_on_the_same_cores_share_a_group_and_pinned_ones_do_not(monkeypatch: pytest.MonkeyPatch) -> None:
    here = cg.compute_group(torch.device("cpu"))
    assert here == cg.compute_group("cpu") and here.startswith(cg.machine_id() + "/cpu-")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    pinned = cg.compute_group("cpu")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {1}, raising=False)
    assert cg.compute_group("cpu") != pinned
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(256)), raising=False)
    assert len(cg.compute_group("cpu")) <= 128  # a many-core set is named by its digest


def test_the_machine_falls_back_to_the_host_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cg, "_BOOT_ID", Path("/nonexistent/boot_id"))
    assert cg.machine_id() == socket.gethostname()


def test_an_operator_names_the_group(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cg.ENV_VAR, "rack-3/box-7")
    assert cg.compute_group("cpu") == "rack-3/box-7"
    monkeypatch.setenv(cg.ENV_VAR, "  ")  # blank: detected as usual
    assert cg.compute_group("cpu").endswith("/cpu-" + ",".join(
        map(str, sorted(os.sched_getaffinity(0)))))


def test_the_compute_share_is_the_engines_threads_over_its_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert cg.compute_share("cpu") == 0.5  # two such agents fit the two cores: neither slows the other
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)
    assert cg.compute_share("cpu") == 1.0  # more threads than cores: the whole group, no more
