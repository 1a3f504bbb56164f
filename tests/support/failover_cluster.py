"""Kill the active metadata service under load: the harness that tests/cluster/metadata/test_metadata_failover.py
asserts on and bench/failover.py reports.

Real parts: a redis-server, two metadata service processes on it (leader_server: the active holds
the leader key, the standby waits for it), in-process NodeAgents (the tiny seeded model) and a Router
whose metadata client lists both addresses, and clients sending requests the whole time. The active
is killed with SIGKILL (no graceful stop, its leader key stays until its ttl ends).

Measured:
- takeover_s: the kill until a metadata client (listing both addresses, as agents and router do)
  gets its first answer from the standby;
- failed: requests that raised (the router must ride the outage out on its fallback);
- stale_max_s: the longest time the router's replica, while in sync (the only time it answers),
  listed a (node, block) that node's cache no longer held. Sampled every `sample_s`; a block evicted
  between the two reads of one sample shows as a span of ~0 s, so short spans are not all real.

Measured too, as baselines of the same run on the same box (a loaded box stretches all of them):
- standby_start_s: the standby's own start, from taking the leader key to serving (restoring the
  index from Redis, binding): work, where the rest of takeover_s is waiting (the key's ttl, the
  standby's poll, the clients' reconnect);
- stale_before_kill_s: stale_max_s before the kill, the event path's own latency (publish, index,
  watch stream) under this load;
- settle_s: the load's end until the replica lists no block its node no longer holds (None: not
  within 30 s, an eviction lost for good).
"""

import asyncio
import os
import random
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

import grpc
import redis.asyncio

from radixmesh.cluster.fleet.agent_client import LocalAgentClient, StaticAgentDirectory
from radixmesh.cluster.policy.base import PolicyConfig
from radixmesh.cluster.router.router import Router
from radixmesh.common.metadata.auth import CallerCredentials
from radixmesh.common.metadata.client import MetadataClient
from radixmesh.node_agent.agent import NodeAgent
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.events import Tier
from radixmesh.proto.ids import NodeId
from radixmesh.proto.serve.plan import ServePlan
from radixmesh.proto.serve.sampling import SamplingParams
from tests.support.router_cluster import BS, SECRET, agent_config, router_config
from tests.support.servers import free_port, running_redis

LEADER_TTL_S = 1.0
"""The leader key's ttl: the standby can take over at most this long after the active died."""

LEADER_KEY = "radixmesh:leader"
"""LeaderLease's default key; its value names the holder ("127.0.0.1:<port>")."""

SETTLE_TIMEOUT_S = 30.0


@dataclass
class FailoverResult:
    takeover_s: float
    standby_serving_s: float
    """The kill until the standby said it serves (the rest of takeover_s is the client reconnecting)."""
    requests: int
    failed: int
    stale_max_s: float
    samples: int
    replica_snapshots: int
    standby_start_s: float
    """The standby's start, from taking the leader key to saying it serves."""
    stale_before_kill_s: float
    """stale_max_s over the samples before the kill."""
    settle_s: float | None
    """The load's end until a sample of the in-sync replica listed nothing stale; None: not within
    SETTLE_TIMEOUT_S."""
    errors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {"takeover_s": self.takeover_s, "standby_serving_s": self.standby_serving_s, "requests": self.requests, "requests_failed": self.failed,
                "replica_stale_max_s": self.stale_max_s, "stale_samples": self.samples,
                "replica_snapshots": self.replica_snapshots, "leader_ttl_s": LEADER_TTL_S,
                "standby_start_s": self.standby_start_s, "replica_stale_before_kill_s": self.stale_before_kill_s,
                "replica_settle_s": self.settle_s}


class MetadataProcess:
    """One `python -m radixmesh.cluster.metadata.leader_server` on 127.0.0.1:port; its stdout lines
    are read by a thread so the parent can wait for "serving" without sleeping."""

    def __init__(self, state: str, port: int, lease_ttl_s: float) -> None:
        self.port = port
        env = {**os.environ, "RADIXMESH_SECRET": SECRET.to_hex()}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "radixmesh.cluster.metadata.leader_server", "--state", state,
             "--port", str(port), "--lease-ttl", str(lease_ttl_s), "--leader-ttl", str(LEADER_TTL_S)],
            stdout=subprocess.PIPE, text=True, env=env)
        self.serving = threading.Event()
        self.serving_at: float | None = None
        """time.monotonic() when it said it serves."""
        self.waiting = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if "serving" in line:
                self.serving_at = time.monotonic()
                self.serving.set()
            elif "waiting" in line:
                self.waiting.set()

    async def wait(self, event: threading.Event, timeout_s: float = 60.0) -> None:
        if not await asyncio.to_thread(event.wait, timeout_s):
            raise TimeoutError(f"metadata process on port {self.port}: exit {self.proc.poll()}")

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()


def prompt(rng: random.Random) -> tuple[int, ...]:
    """One of 6 shared system prefixes, then a unique tail: prefix hits and, in a small pool, evictions."""
    head = rng.randrange(6)
    return tuple((head * 37 + i) % 250 for i in range(6 * BS)) + tuple(rng.randrange(250) for _ in range(2 * BS))


async def cached_hashes(agent: NodeAgent) -> set[BlockHash]:
    def read() -> set[BlockHash]:
        return {h for s in agent.memory.snapshot() if s.tier is not Tier.DISK for h in s.hashes}
    return await agent.runner.call(read)


async def run_failover(*, nodes: int = 2, clients: int = 3, before_s: float = 2.0, after_s: float = 3.0,
                       lease_ttl_s: float = 5.0, gpu_blocks: int = 48, sample_s: float = 0.02) -> FailoverResult:
    with running_redis() as url:
        ports = free_port(), free_port()
        active = MetadataProcess(url, ports[0], lease_ttl_s)
        standby: MetadataProcess | None = None
        agents: list[NodeAgent] = []
        router: Router | None = None
        target = f"ipv4:127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}"
        creds = CallerCredentials.cluster(SECRET)
        probe = MetadataClient(target, credentials=creds, timeout_s=0.2)
        try:
            await active.wait(active.serving)
            standby = MetadataProcess(url, ports[1], lease_ttl_s)
            await standby.wait(standby.waiting)
            agents = [NodeAgent(agent_config(chr(ord("a") + i), target, gpu_blocks=gpu_blocks)) for i in range(nodes)]
            for a in agents:
                await a.start()
            layout = agents[0].layout
            config = router_config(layout.fingerprint(), policy_config=PolicyConfig(block_bytes=layout.block_bytes),
                                   metadata_retry_s=0.2, match_timeout_s=0.2)
            router = Router(config, StaticAgentDirectory([LocalAgentClient(a) for a in agents]),
                            MetadataClient(target, credentials=creds, timeout_s=1.0), rng=random.Random(0))
            return await _under_load(url, active, standby, probe, router, agents, clients, before_s, after_s,
                                     sample_s)
        finally:
            if router is not None:
                await router.close()
                assert router.metadata is not None
                await router.metadata.close()
            for a in agents:
                await a.stop()
            await probe.close()
            for p in (active, standby):
                if p is not None:
                    p.stop()


async def _under_load(redis_url: str, active: MetadataProcess, standby: MetadataProcess, probe: MetadataClient,
                      router: Router, agents: list[NodeAgent], clients: int, before_s: float, after_s: float,
                      sample_s: float) -> FailoverResult:
    assert router.watcher is not None
    router.start()
    done = asyncio.Event()
    counts = {"requests": 0, "failed": 0}
    errors: list[str] = []

    async def client(k: int) -> None:
        rng = random.Random(k)
        while not done.is_set():
            request = ServePlan(f"c{k}-{counts['requests']}", prompt(rng),
                                      SamplingParams(max_tokens=2, ignore_eos=True))
            counts["requests"] += 1
            try:
                await router.complete(request)
            except Exception as e:  # noqa: BLE001 -- any failure at all is what this counts
                counts["failed"] += 1
                errors.append(repr(e))

    by_node = {a.node: a for a in agents}

    async def sample() -> tuple[float, set[tuple[NodeId, BlockHash]] | None]:
        """When, and which (node, block) the in-sync replica lists that its node no longer holds (None:
        the replica is out of sync, so it answers nothing)."""
        replica = router.watcher.replica  # type: ignore[union-attr]
        if not replica.in_sync:
            return time.monotonic(), None
        listed = {(node, h) for node in replica.index.nodes() for c in replica.index.node_chains(node)
                  for h in c.hashes}
        now = time.monotonic()
        held = {(a.node, h) for a in agents for h in await cached_hashes(a)}
        return now, {e for e in listed if e[0] in by_node and e not in held}

    stale_since: dict[tuple[NodeId, BlockHash], float] = {}
    stale_max = {"before kill": 0.0, "all": 0.0}
    samples = 0
    killed = float("inf")

    async def watch_staleness() -> None:
        nonlocal samples
        while not done.is_set():
            now, stale = await sample()
            for e in list(stale_since):
                if not stale or e not in stale:
                    del stale_since[e]
            for e in stale or ():
                span = now - stale_since.setdefault(e, now)
                stale_max["all"] = max(stale_max["all"], span)
                if now < killed:
                    stale_max["before kill"] = max(stale_max["before kill"], span)
            samples += 1
            await asyncio.sleep(sample_s)  # the sampling period of the monitor, not a synchronisation

    async def first_answer_after(killed: float) -> float:
        while True:
            try:
                await probe.stats()
                return time.monotonic() - killed
            except grpc.aio.AioRpcError:
                await asyncio.sleep(0.01)  # polling the standby's port, by design

    async def standby_holds_the_key() -> float:
        keys = redis.asyncio.Redis.from_url(redis_url)
        try:
            while await keys.get(LEADER_KEY) != f"127.0.0.1:{standby.port}".encode():
                await asyncio.sleep(0.005)  # polling the key, by design: taking it, the standby says nothing
            return time.monotonic()
        finally:
            await keys.aclose()

    async def settle() -> float | None:
        ended = time.monotonic()
        while time.monotonic() - ended < SETTLE_TIMEOUT_S:
            if (await sample())[1] == set():
                return time.monotonic() - ended
            await asyncio.sleep(sample_s)  # polling the replica and the caches, by design
        return None

    tasks = [asyncio.create_task(client(k)) for k in range(clients)]
    monitor = asyncio.create_task(watch_staleness())
    key = asyncio.create_task(standby_holds_the_key())
    try:
        await asyncio.sleep(before_s)  # load runs this long before the kill: the run's schedule
        killed = time.monotonic()
        await asyncio.to_thread(active.kill)
        takeover = await asyncio.wait_for(first_answer_after(killed), 30.0)
        key_taken = await asyncio.wait_for(key, 30.0)
        await asyncio.sleep(after_s)  # and this long after the takeover
    finally:
        done.set()
        key.cancel()  # done unless the takeover failed
        await asyncio.gather(key, return_exceptions=True)
        await asyncio.gather(*tasks, monitor)
    settle_s = await settle()
    assert standby.serving_at is not None
    return FailoverResult(takeover, standby.serving_at - killed, counts["requests"], counts["failed"],
                          stale_max["all"], samples, router.watcher.snapshots, max(0.0, standby.serving_at - key_taken),
                          stale_max["before kill"], settle_s, errors)
