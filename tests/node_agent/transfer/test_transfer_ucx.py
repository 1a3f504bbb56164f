"""Pulls over UCX between two processes on 127.0.0.1: the owner in a spawned process, the requester here."""

import asyncio
import contextlib
import multiprocessing as mp
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection
from typing import Any

import pytest

from radixmesh.common.block_pool.block_pool import BlockPool
from radixmesh.common.prefix_cache.prefix_cache import PrefixCache
from radixmesh.common.secret import ClusterSecret
from radixmesh.node_agent.transfer import ucx_progress
from radixmesh.node_agent.transfer.client import PullConfig, PullOutcome, PullResult, TransferClient
from radixmesh.node_agent.transfer.handshake import NodeIdentity
from radixmesh.node_agent.transfer.transport import Peer
from radixmesh.node_agent.transfer.ucx_env import ucx_env
from radixmesh.node_agent.transfer.ucx_progress import UcxProgress
from radixmesh.node_agent.transfer.ucx_transport import UcxTransport, import_ucxx
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.events import BlockStored, Tier
from radixmesh.proto.ids import NodeId
from radixmesh.proto.kv_layout import KVLayout
from tests.support.transfer_owner import (
    LAYOUT,
    OWNER,
    REQUESTER,
    SECRET,
    OwnerSpec,
    build_source,
    kv_digest,
    run_owner,
    run_vanishing_requester,
    sequence_hashes,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

CTX = mp.get_context("spawn")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
CHUNK = 3 * LAYOUT.block_bytes  # 3 blocks per chunk: every pull of more than 3 blocks is pipelined


class Owner:
    """Handle on an owner process; every call is a pipe round trip (the owner's own readiness)."""

    def __init__(self, spec: OwnerSpec | None = None):
        self.conn, child = CTX.Pipe()
        self.proc = CTX.Process(target=run_owner, args=(child, spec or OwnerSpec()), daemon=True)
        self.proc.start()
        tag, self.port = self.conn.recv()
        assert tag == "ready"

    def call(self, *cmd: Any) -> Any:
        self.conn.send(cmd)
        return self.conn.recv()

    def peer(self, node: NodeId = OWNER) -> Peer:
        return Peer(node, "127.0.0.1", self.port)

    def stop(self) -> None:
        if self.proc.is_alive():
            assert self.call("stop") == "stopped"
        self.proc.join(10)


class Requester:
    """This process's node: pool, cache, KV and a TransferClient over UCX."""

    def __init__(self, loop: asyncio.AbstractEventLoop, layout: KVLayout = LAYOUT, secret: ClusterSecret = SECRET,
                 checksum: str = "crc32", timeout_s: float = 10.0, mac: bool = False):
        self.loop = loop
        self.pool = BlockPool(64, tier=Tier.HOST, block_bytes=layout.block_bytes)
        self.cache = PrefixCache(self.pool)
        self.kv = layout.new_cache(64)
        config = PullConfig(chunk_bytes=CHUNK, checksum=checksum, timeout_s=timeout_s, mac=mac)
        transport = UcxTransport(NodeIdentity(secret, REQUESTER), loopback=True)
        self.client = TransferClient(self.cache, self.kv, layout, config, transport)

    def pull(self, peer: Peer, hashes: list[BlockHash]) -> PullResult:
        return self.loop.run_until_complete(self.client.pull(peer, hashes))

    def finish(self, result: PullResult) -> None:
        """Release the caller's references; afterwards nothing may be in use."""
        self.cache.release(result.block_ids)
        self.cache.check_invariants()
        assert self.pool.num_in_use == 0
        self.loop.run_until_complete(self.client.close())


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    # One loop for the module: ucxx binds its progress to the loop that first used it.
    lp = asyncio.new_event_loop()
    yield lp
    pending = asyncio.all_tasks(lp)  # none, unless a test left one (UCX progress runs on callbacks)
    for t in pending:
        t.cancel()
    if pending:  # gather() of nothing would make its future on another loop
        lp.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    lp.close()


@pytest.fixture(scope="module")
def owner() -> Iterator[Owner]:
    o = Owner()
    yield o
    o.stop()


def assert_owner_clean(owner: Owner) -> None:
    state = owner.call("state")
    assert state["pinned"] == 0 and state["in_use"] == 0, state


def test_pulled_blocks_are_bitwise_equal_to_owner(loop: asyncio.AbstractEventLoop, owner: Owner) -> None:
    req = Requester(loop)
    hashes = sequence_hashes(40)
    result = req.pull(owner.peer(), hashes)
    assert result.outcome is PullOutcome.OK
    assert result.hashes == hashes and result.blocks == 40
    assert result.nbytes == 40 * LAYOUT.block_bytes
    assert kv_digest(req.kv, result.block_ids) == owner.call("digest", 40)
    assert req.cache.longest_prefix(hashes) == 40
    assert req.cache.take_events() == [BlockStored(tuple(hashes), None, Tier.HOST)]
    stats = req.client.stats[NodeId("owner")]
    assert (stats.transport, stats.pulls, stats.blocks, stats.bytes) == ("ucx", 1, 40, result.nbytes)
    assert stats.ewma_gbps > 0 and 0 < stats.ewma_latency_s <= result.seconds
    req.finish(result)
    assert_owner_clean(owner)


IDLE_S = 5.0
IDLE_CPU_S = 0.05 * IDLE_S
"""CPU seconds a process may use over the idle window (5% of a core): ucxx's own blocking mode spins a
core (close to IDLE_S) on both sides. CPU time, not wall time: a loaded box does not add to it."""


async def idle(seconds: float) -> None:
    """The loop runs for `seconds` with nothing to do but UCX's progress: an event nobody sets."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.Event().wait(), seconds)


async def progress_driver() -> UcxProgress:
    d = ucx_progress.driver(import_ucxx(loopback=True))
    assert d is not None
    return d


def test_idle_after_pulls_costs_no_cpu_and_the_next_pull_wakes_at_once(loop: asyncio.AbstractEventLoop,
                                                                       owner: Owner) -> None:
    hashes = sequence_hashes(40)
    warm = 0.0  # the slowest of these pulls: what a pull takes on this box now
    for _ in range(3):
        req = Requester(loop)
        start = time.perf_counter()
        result = req.pull(owner.peer(), hashes)
        warm = max(warm, time.perf_counter() - start)
        assert result.outcome is PullOutcome.OK and result.blocks == 40
        req.finish(result)
    driver = loop.run_until_complete(progress_driver())
    # No safety tick from here on (the one already due may still run): the next pull must be woken
    # by the worker's fd alone, or it would wait out its 10 s timeout.
    driver.tick_s = 600.0
    try:
        idle_then_pull(loop, owner, driver, hashes, warm)
    finally:
        driver.tick_s = UcxProgress.tick_s


def idle_then_pull(loop: asyncio.AbstractEventLoop, owner: Owner, driver: UcxProgress,
                   hashes: list[BlockHash], warm_s: float) -> None:
    owner_cpu = owner.call("cpu")
    cpu, wall = time.process_time(), time.perf_counter()
    loop.run_until_complete(idle(IDLE_S))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    owner_cpu = owner.call("cpu") - owner_cpu
    print(f"idle {wall:.2f} s: requester {cpu:.3f} s CPU, owner {owner_cpu:.3f} s CPU")
    assert cpu < IDLE_CPU_S, f"requester used {cpu:.3f} s of CPU in {wall:.2f} s idle"
    assert owner_cpu < IDLE_CPU_S, f"owner used {owner_cpu:.3f} s of CPU in {wall:.2f} s idle"

    rescued = driver.rescued
    req = Requester(loop)
    start = time.perf_counter()
    result = req.pull(owner.peer(), hashes)
    elapsed = time.perf_counter() - start
    print(f"pull after idle: {elapsed * 1e3:.1f} ms, {driver.wakeups} wake-ups, {driver.arms} arms")
    assert result.outcome is PullOutcome.OK and result.blocks == 40
    assert kv_digest(req.kv, result.block_ids) == owner.call("digest", 40)
    assert driver.rescued == rescued  # woken by UCX's events, not by a tick
    # At once: as fast as the pulls before the idle window, give or take the box's load (twice the
    # slowest of them), where a pull waiting on a timer would wait a tick (1 s) or its 10 s timeout.
    assert elapsed < 2 * warm_s + UcxProgress.tick_s, f"{elapsed:.2f} s after idle, {warm_s:.2f} s warm"
    req.finish(result)
    assert_owner_clean(owner)


def test_partial_availability_returns_the_held_prefix(loop: asyncio.AbstractEventLoop, owner: Owner) -> None:
    req = Requester(loop)
    hashes = sequence_hashes(50)  # the owner holds the first 40 only
    result = req.pull(owner.peer(), hashes)
    assert result.outcome is PullOutcome.OK and result.hashes == hashes[:40]
    assert kv_digest(req.kv, result.block_ids) == owner.call("digest", 40)
    assert req.pool.num_in_use == 40  # the 10 surplus blocks went back to the pool
    req.finish(result)
    assert_owner_clean(owner)


def test_other_secret_or_other_owner_is_refused_and_pins_nothing(loop: asyncio.AbstractEventLoop,
                                                                 owner: Owner) -> None:
    # A requester without the secret, and one expecting another node at this address.
    for secret, expected in ((ClusterSecret.generate(), OWNER), (SECRET, NodeId("node-7"))):
        req = Requester(loop, secret=secret)
        result = req.pull(owner.peer(expected), sequence_hashes(8))
        assert (result.outcome, result.blocks, result.nbytes) == (PullOutcome.UNAUTHENTICATED, 0, 0)
        assert req.cache.take_events() == [] and len(req.cache) == 0
        req.finish(result)
    assert_owner_clean(owner)


def test_other_layout_is_refused(loop: asyncio.AbstractEventLoop, owner: Owner) -> None:
    other = KVLayout("tiny-seed0", num_layers=2, num_kv_heads=2, head_dim=8, dtype="float16", block_size=4)
    req = Requester(loop, layout=other)
    result = req.pull(owner.peer(), sequence_hashes(8))
    assert (result.outcome, result.blocks) == (PullOutcome.LAYOUT_MISMATCH, 0)
    req.finish(result)
    assert_owner_clean(owner)


def test_corrupted_chunk_is_refused_and_earlier_chunks_kept(loop: asyncio.AbstractEventLoop, owner: Owner) -> None:
    assert owner.call("fault", "corrupt") == "ok"  # flips a byte of chunk 1 (blocks 3..5)
    req = Requester(loop)
    hashes = sequence_hashes(12)
    result = req.pull(owner.peer(), hashes)
    assert result.outcome is PullOutcome.CHECKSUM_MISMATCH
    assert result.hashes == hashes[:3]  # chunk 0 arrived intact; nothing from chunk 1 on is kept
    assert kv_digest(req.kv, result.block_ids) == owner.call("digest", 3)
    assert req.cache.longest_prefix(hashes) == 3
    req.finish(result)
    assert_owner_clean(owner)


def test_owner_releases_pins_when_requester_vanishes(owner: Owner) -> None:
    conn, child = CTX.Pipe()
    proc = CTX.Process(target=run_vanishing_requester, args=(child, owner.port, 40), daemon=True)
    proc.start()
    assert conn.recv() == ("asked", 40)  # the owner has pinned 40 blocks and is sending
    proc.kill()
    proc.join(10)
    assert_owner_clean(owner)  # waits until the owner has finished (failed) that pull


def test_stalled_owner_times_out_and_keeps_what_arrived(loop: asyncio.AbstractEventLoop) -> None:
    stalled = Owner()
    try:
        assert stalled.call("fault", "stall") == "ok"  # hangs (alive) after handing chunk 1 to UCX
        req = Requester(loop, timeout_s=1.0)
        result = req.pull(stalled.peer(), sequence_hashes(40))
        assert stalled.conn.recv() == "stalled"
        assert result.outcome is PullOutcome.TIMEOUT
        assert result.blocks <= 6 and result.hashes == sequence_hashes(40)[: result.blocks]
        assert req.client.stats[NodeId("owner")].outcomes == {"timeout": 1}
        req.finish(result)
    finally:
        stalled.proc.kill()
        stalled.proc.join(10)


def test_owner_killed_mid_transfer(loop: asyncio.AbstractEventLoop) -> None:
    dying = Owner(OwnerSpec(seed=0))
    try:
        assert dying.call("fault", "stall") == "ok"  # hangs after handing chunk 1 to UCX
        req = Requester(loop)
        task = loop.create_task(req.client.pull(dying.peer(), sequence_hashes(40)))
        stalled: Connection = dying.conn
        assert loop.run_until_complete(loop.run_in_executor(None, stalled.recv)) == "stalled"
        dying.proc.kill()
        result = loop.run_until_complete(task)
        assert result.outcome is PullOutcome.PEER_LOST
        assert result.blocks <= 6 and result.hashes == sequence_hashes(40)[: result.blocks]
        # Whatever arrived is intact: compare with the same seeded owner rebuilt here.
        replica = build_source(OwnerSpec(seed=0))
        held = replica.cache.match(result.hashes)
        assert kv_digest(req.kv, result.block_ids) == kv_digest(replica.kv, held)
        req.finish(result)
    finally:
        dying.proc.kill()
        dying.proc.join(10)


def test_a_staged_owner_sends_the_same_bytes(loop: asyncio.AbstractEventLoop) -> None:
    """The owner side of MemoryPath.CUDA_STAGED (chunks copied to host memory first): what arrives is
    bitwise the owner's KV. On a CPU pool the copy is the identity; the path is the GPU one."""
    staged = Owner(OwnerSpec(stage_to_host=True))
    try:
        req = Requester(loop)
        hashes = sequence_hashes(40)
        result = req.pull(staged.peer(), hashes)
        assert result.outcome is PullOutcome.OK and result.blocks == 40
        assert kv_digest(req.kv, result.block_ids) == staged.call("digest", 40)
        req.finish(result)
        assert_owner_clean(staged)
    finally:
        staged.stop()


def _pull_once() -> None:
    """A child's whole life (see the test below): one pull from a fresh owner, then exit."""
    loop = asyncio.new_event_loop()
    owner = Owner()
    try:
        req = Requester(loop)
        result = req.pull(owner.peer(), sequence_hashes(40))
        assert result.outcome is PullOutcome.OK and result.blocks == 40
        req.finish(result)
    finally:
        owner.stop()
        loop.close()


def test_agents_of_one_host_move_payload_over_shared_memory() -> None:
    """UCX picks a shared-memory transport (posix/sysv) for the payload between two processes of one
    host, not TCP: ucxx's endpoints ask for peer error handling, which UCX grants shared memory only
    with UCX_MM_ERROR_HANDLING (ucx_env.LOOPBACK_ENV). UCX names each endpoint's lanes at info
    level ("intra-node cfg#N tag(<transport>/<device>) ..."), so both processes are run with it."""
    env = {k: v for k, v in os.environ.items() if k not in ucx_env(loopback=True)}  # ucx_env's own values
    env["UCX_LOG_LEVEL"] = "info"
    script = "from tests.node_agent.transfer.test_transfer_ucx import _pull_once; _pull_once()"
    child = subprocess.run([sys.executable, "-c", script], check=False, env=env, cwd=REPO, capture_output=True,
                           text=True, timeout=100)
    assert child.returncode == 0, child.stderr[-2000:]
    # UCX logs to stdout. The owner's endpoint sends the payload (the requester only receives).
    lanes = [line for line in child.stdout.splitlines() if "intra-node cfg" in line and " tag(" in line]
    assert lanes, child.stdout[-2000:]
    for line in lanes:
        tag_lane = line.split(" tag(", 1)[1].split(")", 1)[0]
        assert tag_lane.endswith("/memory") and tag_lane.split("/")[0] in ("posix", "sysv"), line
