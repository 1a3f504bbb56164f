"""The arms a bench compares, and the clusters it runs them on.

An arm is a routing policy with caching on, or caching off, or (split_<P>p, split_half, run only
when named) the cost policy over the same agents split into prefill and decode agents, whose
hand-off follows the prefill (streamed) unless the arm's name ends in `_after` (split_half_after:
the hand-off begins once the prefill has ended). `off` routes least-loaded (the best a
cluster without a cache can do) and sends every request with its own cache_salt, so nothing is
reused even on a running deployment that caches; a local `off` cluster also runs its agents
without prefix caching.

A `Clusters` object gives a cluster for an arm: `LocalClusters` starts a fresh deployment through
the launcher for every cell (same model, same memory, cold caches) and stops it after; `RunningCluster`
is one deployment at a URL, which serves only the arm of its own policy (and `off`).
"""

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Protocol

from radixmesh.cluster.launch import launcher
from radixmesh.cluster.launch.config import LauncherConfig
from radixmesh.cluster.sim.router_client import KEYLESS, ClientAccess, router_stats, served_model


@dataclass(frozen=True, slots=True)
class Arm:
    name: str
    policy: str
    caching: bool = True
    split: str = ""
    """A prefill/decode split of the same agents (docs/disaggregation.md): "<P>p" P prefill agents and
    the rest decode ("1p", "6p"), "half" half of them prefill (rounded down); "": every agent does both."""
    stream: bool = True
    """A split's hand-off follows the prefill chunk by chunk (LauncherConfig.stream_handoff); False: it
    begins once the prefill has ended (the `_after` arms)."""

    def prefill_nodes(self, agents: int) -> int:
        """How many of `agents` prefill (0: no split). ValueError when a split cannot be made: fewer
        than 2 agents, or P outside [1, agents - 1] (every split needs a decode agent)."""
        if not self.split:
            return 0
        if agents < 2:
            raise ValueError(f"arm {self.name!r} splits prefill from decode: it needs at least 2 agents, got {agents}")
        prefill = agents // 2 if self.split == "half" else int(self.split.removesuffix("p"))
        if not 1 <= prefill < agents:
            raise ValueError(f"arm {self.name!r} prefills on {prefill} of {agents} agents: P of split_<P>p must be "
                             f"between 1 and {agents - 1} (N - 1, so that at least one agent decodes)")
        return prefill


ARMS = {arm.name: arm for arm in (
    Arm("cost", "cost"),
    Arm("cost_no_pull", "cost_no_pull"),
    Arm("prefix_affinity", "prefix_affinity"),
    Arm("least_loaded", "least_loaded"),
    Arm("round_robin", "round_robin"),
    Arm("off", "least_loaded", caching=False),
    Arm("split_1p", "cost", split="1p"),
    Arm("split_half", "cost", split="half"),
)}
"""The named arms, in the order a bench runs them; arm_named adds split_<P>p for any P."""
DEFAULT_ARMS = tuple(name for name, arm in ARMS.items() if not arm.split)
"""The arms a bench runs unless told: the split arms only when named (`--arms cost,split_half`)."""
SPLIT_ARM = re.compile(r"split_(\d+)p")
"""split_<P>p: the cost policy over P prefill agents, the rest of the agents decode."""


AFTER = "_after"
"""The suffix of a split arm whose hand-off begins once the prefill has ended (not streamed)."""
VALID_ARMS = (f"{', '.join(ARMS)}, split_<P>p (P prefill agents, the rest decode), and any split arm + {AFTER} "
              "(its hand-off after the prefill, not streamed)")
"""What a bench can be asked to run, for its error messages."""


def is_arm(name: str) -> bool:
    """Whether `name` names an arm (arm_named may still refuse its P)."""
    split = name.removesuffix(AFTER)
    if split != name:
        return split.startswith("split_") and not split.endswith(AFTER) and is_arm(split)
    return name in ARMS or SPLIT_ARM.fullmatch(name) is not None


def arm_named(name: str) -> Arm:
    """The arm called `name`: one of ARMS, or split_<P>p for any P >= 1 (whether P leaves a decode
    agent is checked against the cluster's size, Arm.prefill_nodes), or a split arm + `_after`.
    ValueError naming the valid ones."""
    if name.endswith(AFTER):
        split = arm_named(name.removesuffix(AFTER))
        if not split.split or not split.stream:
            raise ValueError(f"arm {name!r}: only a split arm has a hand-off to begin after the prefill")
        return replace(split, name=split.name + AFTER, stream=False)
    if name in ARMS:
        return ARMS[name]
    match = SPLIT_ARM.fullmatch(name)
    if match is None:
        raise ValueError(f"unknown arm {name!r}; valid: {VALID_ARMS}")
    prefill = int(match[1])
    if prefill < 1:
        raise ValueError(f"arm {name!r}: P of split_<P>p must be between 1 and N - 1 (N: the agents of --local)")
    return Arm(f"split_{prefill}p", "cost", split=f"{prefill}p")


AGENTS_TIMEOUT_S = 300.0
"""How long a local deployment may take to start all its agents (a real model loads in each)."""


@dataclass(frozen=True, slots=True)
class Target:
    """A cluster serving one arm: where its router listens, what it calls the model, how to reach it."""

    url: str
    model: str
    access: ClientAccess = KEYLESS


class Clusters(Protocol):
    def cluster(self, arm: Arm) -> contextlib.AbstractAsyncContextManager[Target]:
        """A cluster serving `arm` for the duration of the context."""
        ...


class LocalClusters:
    """A fresh deployment of `base` (with the arm's policy and caching) per cell, on the Ray this
    process started (launcher.init_local_ray)."""

    def __init__(self, base: LauncherConfig) -> None:
        self.base = base

    @contextlib.asynccontextmanager
    async def cluster(self, arm: Arm) -> AsyncIterator[Target]:
        config = self.config(arm)
        deployment = await launcher.up(config)
        try:
            await self._all_agents(len(deployment.nodes))
            yield Target(deployment.router_url, config.served_model_name)
        finally:
            await launcher.down()

    def config(self, arm: Arm) -> LauncherConfig:
        """The deployment of `arm`: the base's agents, with its policy, caching and split."""
        prefill = arm.prefill_nodes(self.base.local_nodes or 0)
        decode = (self.base.local_nodes or 0) - prefill if prefill else 0
        return replace(self.base, policy=arm.policy, prefix_caching=arm.caching, prefill_nodes=prefill,
                       decode_nodes=decode, stream_handoff=arm.stream)

    async def _all_agents(self, started: int) -> None:
        """Wait until the router routes over every local agent: `up` returns once the first has started."""
        expected = self.base.local_nodes or started
        deadline = time.monotonic() + AGENTS_TIMEOUT_S
        while started < expected:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{started} of {expected} agents after {AGENTS_TIMEOUT_S:.0f} s")
            await asyncio.sleep(0.5)  # the agents start in their own actors: nothing to wait on here
            started = len(await launcher.router_handle().nodes.remote())


class RunningCluster:
    """The deployment at `url`, for the arm of its policy and for `off`."""

    def __init__(self, url: str, access: ClientAccess = KEYLESS) -> None:
        self.url = url.rstrip("/")
        self.access = access

    async def policy(self) -> str:
        """The policy the deployment routes with (its /stats)."""
        return str((await router_stats(self.url, self.access))["policy"])

    @contextlib.asynccontextmanager
    async def cluster(self, arm: Arm) -> AsyncIterator[Target]:
        if arm.split:
            raise ValueError(f"arm {arm.name!r} splits the agents of a fresh local cluster (--local), not of a "
                             "running deployment")
        if arm.caching and arm.policy != await self.policy():
            raise ValueError(f"the deployment at {self.url} routes with {await self.policy()!r}, not "
                             f"{arm.policy!r} (arm {arm.name!r})")
        yield Target(self.url, await served_model(self.url, self.access), self.access)
