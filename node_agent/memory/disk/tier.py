"""The disk tier as the host tier uses it: `offer` hands a block over and returns at once, a writer
thread batches what was offered into large sequential appends, `get` answers from what is still
queued or from disk. `NoDiskTier` is the disk tier of a node without one.

The writer thread is the only one that appends (SegmentStore's contract); the engine thread only
copies a block's bytes out (it must: the host block is reused as soon as it is evicted) and reads.
When the disk falls behind, offers past `queue_bytes` are dropped and counted, never waited for:
a demotion is an optimisation, a stalled engine is not. The bound is in bytes, not blocks: 4,096
blocks were 8 GiB of memory at Llama-3-8B's 2 MiB blocks (issue 38). `write` waits instead: a clean
stop uses it to keep what the gpu and host tiers hold (memory.tiers.persist_resident).

What the writer writes and what appends evict become index events (`take_events`, tier disk), so
the cluster routes to a block the host evicted to disk without waiting for a re-registration
(issue 40: before, it left the index until the next snapshot).
"""

import logging
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from radixmesh.node_agent.memory.disk.metrics import DiskStats
from radixmesh.node_agent.memory.disk.record import DiskBlock, DiskIdentity, Dropped
from radixmesh.node_agent.memory.disk.segments import SegmentStore
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.events import BlockRemoved, CacheEvent, Tier, chains

log = logging.getLogger(__name__)

GB = 1 << 30
ANNOUNCED_BLOCKS = 1 << 19
"""Disk blocks a node announces to the index at most: a restarted node's snapshot names its newest
this many, and arrivals are published only while the tier holds no more (the index refuses a node
past its declared capacity, which counts at most this many disk blocks)."""
MEASURED_BYTES = 16 << 20
"""Bytes read before a read rate is trusted: below it, a few small reads measure syscall overhead."""


@dataclass(frozen=True, slots=True)
class DiskConfig:
    """Where one agent keeps its disk tier and how much of it."""

    path: Path
    """Directory of the segment files: this user's, written by nobody else, one agent's at a time
    (memory.disk.directory checks and locks it)."""
    capacity_bytes: int
    """Bound on the segment files' size; the oldest segment goes first past it."""
    segment_bytes: int = 64 << 20
    """Size of one segment file: the unit of eviction, and the most one append writes at once."""
    queue_bytes: int = 256 << 20
    """KV bytes offered but not yet written, at most; offers past it are dropped (one block is always
    taken into an empty queue, whatever its size)."""
    persist_s: float = 20.0
    """Seconds a clean stop spends at most writing the gpu and host tiers' cached blocks that the
    disk lacks, so a restart finds them (0: none). The launcher waits 30 s for an agent to stop
    (cluster.launch.reconcile.AGENT_STOP_TIMEOUT_S), and closing writes the queue after this."""

    def __post_init__(self) -> None:
        if self.segment_bytes <= 0 or self.queue_bytes < 1 or not 0 <= self.persist_s < float("inf"):
            raise ValueError(f"need segment_bytes > 0, queue_bytes >= 1 and a finite persist_s >= 0, got "
                             f"{self.segment_bytes}, {self.queue_bytes}, {self.persist_s}")
        if self.capacity_bytes < 2 * self.segment_bytes:  # one segment being written, one or more to evict
            raise ValueError(f"disk capacity must hold 2 segments of {self.segment_bytes} bytes, "
                             f"got {self.capacity_bytes} bytes")


class DiskTier:
    """A node's disk tier: thread-safe; `close` stops the writer after the queued blocks are written."""

    def __init__(self, config: DiskConfig, identity: DiskIdentity) -> None:
        t0 = time.perf_counter()
        self.store = SegmentStore(config.path, identity, config.capacity_bytes, config.segment_bytes)
        scanned, elapsed = self.store.disk_bytes, time.perf_counter() - t0
        self._scan_bytes_per_s = scanned / elapsed if scanned >= MEASURED_BYTES else 0.0
        """The re-index's read rate (every record read and verified): a restarted node's first price."""
        self._queue: queue.Queue[DiskBlock | None] = queue.Queue()  # bounded by _pending_bytes
        self._pending: dict[BlockHash, bytes] = {}
        self._pending_bytes = 0
        self._queue_bytes = config.queue_bytes
        self.persist_s = config.persist_s
        self._lock = threading.Lock()
        self._written = threading.Condition(self._lock)
        """Notified whenever the writer frees queue bytes (what `write` waits for)."""
        self._batch_blocks = max(1, self.store.records_per_segment // 4)
        self.offers_dropped = 0
        self.write_errors = 0
        self._events: list[CacheEvent] = []
        """Arrivals, evictions and a reset's removals not yet taken (under _lock: two threads add)."""
        self._writer = threading.Thread(target=self._write_loop, name="radixmesh-disk-writer", daemon=True)
        self._writer.start()

    def __contains__(self, block_hash: BlockHash) -> bool:
        return block_hash in self._pending or block_hash in self.store

    def offer(self, block_hash: BlockHash, payload: bytes, *, parent: BlockHash | None) -> None:
        """Write `payload` as `block_hash` (whose chain's previous block is `parent`) soon, unless
        held already or the queue is full."""
        with self._lock:
            if block_hash in self._pending or block_hash in self.store:
                return
            if self._pending and self._pending_bytes + len(payload) > self._queue_bytes:
                self.offers_dropped += 1
                return
            self._queue.put_nowait(DiskBlock(block_hash, payload, parent))
            self._pending[block_hash] = payload
            self._pending_bytes += len(payload)

    def write(self, block_hash: BlockHash, payload: bytes, *, parent: BlockHash | None,
              timeout_s: float | None = None) -> bool:
        """`offer`, but when the queue is full wait (at most `timeout_s`) for the writer to make room
        rather than drop the block; False if the room never came. Never from the engine thread while
        it serves (a slow disk would stall it)."""
        with self._written:
            if not self._written.wait_for(
                    lambda: not self._pending or self._pending_bytes + len(payload) <= self._queue_bytes, timeout_s):
                return False
        self.offer(block_hash, payload, parent=parent)
        return True

    def get_run(self, hashes: Sequence[BlockHash]) -> list[memoryview]:
        """The KV bytes of the longest prefix of `hashes` held here (still queued, or on disk and
        verified), in order, each in a fresh buffer (`get_run_into` fills buffers of the caller's)."""
        into = [memoryview(bytearray(self.store.identity.block_bytes)) for _ in range(self.run_length(hashes))]
        return into[: self.get_run_into(hashes, into)]

    def run_length(self, hashes: Sequence[BlockHash]) -> int:
        """How many of `hashes`, from the first, are held here: the most `get_run_into` serves."""
        n = 0
        while n < len(hashes) and hashes[n] in self:
            n += 1
        return n

    def get_run_into(self, hashes: Sequence[BlockHash], into: Sequence[memoryview]) -> int:
        """Put the KV bytes of the longest prefix of `hashes` held here (still queued, or on disk and
        verified), at most len(into) blocks, into into[0], into[1], ...; returns how many. The
        contract of SegmentStore.get_run_into: a destination past that count may hold any bytes."""
        views = self.store.destinations(into)
        hashes = hashes[: len(views)]
        first = 0  # hashes[first:k] are the disk's share since the last queued block
        for k, block_hash in enumerate(hashes):
            with self._lock:
                queued = self._pending.get(block_hash)
            if queued is None:
                continue
            if first < k:  # the disk's share so far must be whole before a queued block follows it
                got = self.store.get_run_into(hashes[first:k], views[first:k])
                if got < k - first:
                    return first + got
            views[k][:] = queued
            first = k + 1
        return first + self.store.get_run_into(hashes[first:], views[first:]) if first < len(hashes) else first

    def read_bytes_per_s(self) -> float:
        """Measured read rate, verification included: of the tier's reads so far once they add up to
        MEASURED_BYTES, else of the re-index at start-up, else 0 (not measured)."""
        c = self.store.counters
        if c.read_bytes >= MEASURED_BYTES and c.read_seconds > 0:
            return c.read_bytes / c.read_seconds
        return self._scan_bytes_per_s

    @property
    def capacity_blocks(self) -> int:
        """Blocks the tier holds when full."""
        return self.store.max_segments * self.store.records_per_segment

    def chains(self, limit: int) -> list[tuple[BlockHash, BlockHash | None]]:
        """(hash, parent) of up to `limit` blocks on disk, the newest segments' first, ordered so that
        each chain runs head to tail (a parent held here comes before its children): what a
        restarted node announces. The host demotes a chain tail first, so the disk's own order is
        mostly reversed."""
        return head_to_tail(self.store.blocks()[-limit:] if limit > 0 else [])

    def flush(self) -> None:
        """Return once every block offered so far is written (or its write failed)."""
        self._queue.join()

    def clear(self) -> int:
        """Drop every block held (a prefix-cache reset): what is queued is written first, then every
        segment is deleted, so nothing survives into a restart. Call it from the thread that offers
        (the engine's), so no offer races it. Returns the blocks dropped; `take_events` then says
        which, so the index drops them too (between snapshots the disk publishes nothing else)."""
        self.flush()
        dropped = self.store.clear()
        with self._lock:
            if dropped:
                self._events.append(BlockRemoved(tuple(dropped), Tier.DISK))
        return len(dropped)

    def take_events(self) -> list[CacheEvent]:
        """What reached the disk (BlockStored), what it evicted or a reset cleared (BlockRemoved)
        since the last call, in order."""
        with self._lock:
            events, self._events = self._events, []
        return events

    def has_events(self) -> bool:
        """Whether take_events has any to drain (the writer adds them on its own thread, whenever a
        batch lands: not only while the engine works)."""
        with self._lock:
            return bool(self._events)

    def writing(self) -> bool:
        """Whether offered blocks still wait for the writer, which makes events of them on its own
        thread (once none wait, only a new offer, on the engine thread, leads to more)."""
        with self._lock:
            return bool(self._pending)

    def close(self) -> None:
        self._queue.put(None)
        self._writer.join()
        self.store.close()

    def stats(self) -> DiskStats:
        store = self.store
        c = store.counters
        return DiskStats(
            tier="disk",
            disk_bytes=store.disk_bytes,
            disk_capacity_bytes=store.max_segments * store.segment_bytes,
            disk_blocks=len(store),
            disk_reads=c.reads,
            disk_read_bytes=c.read_bytes,
            disk_read_seconds=c.read_seconds,
            disk_writes=c.writes,
            disk_write_bytes=c.write_bytes,
            disk_write_seconds=c.write_seconds,
            disk_evictions=c.evicted,
            disk_dropped_blocks={r.value: c.dropped[r] for r in Dropped},
            disk_offers_dropped=self.offers_dropped,
            disk_write_errors=self.write_errors,
            disk_skipped_files=store.directory.skipped,
        )

    def _write_loop(self) -> None:
        stopping = False
        while not stopping:
            first = self._queue.get()
            if first is None:
                self._queue.task_done()
                return
            batch = [first]
            # Whatever else is queued joins this write, up to a quarter segment: large sequential writes.
            while len(batch) < self._batch_blocks:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:  # close(): this batch is the last
                    stopping = True
                    self._queue.task_done()
                    break
                batch.append(item)
            written: list[DiskBlock] = []
            try:
                written = self.store.append(batch)
            except OSError as e:  # a full or failing disk loses these blocks, never the agent
                self.write_errors += len(batch)
                log.warning("disk tier: writing %d blocks to %s failed: %s", len(batch), self.store.path, e)
            evicted = self.store.take_evicted()
            with self._lock:
                for block in batch:
                    if self._pending.pop(block.block_hash, None) is not None:
                        self._pending_bytes -= len(block.payload)
                self._written.notify_all()
                if evicted:  # before the arrivals: an append evicts only blocks it does not write
                    self._events.append(BlockRemoved(tuple(evicted), Tier.DISK))
                if len(self.store) <= ANNOUNCED_BLOCKS:
                    self._events += chains(head_to_tail([(b.block_hash, b.parent) for b in written]), Tier.DISK)
            for _ in batch:
                self._queue.task_done()


class NoDiskTier:
    """No disk tier: nothing is kept, nothing is found, nothing is announced or measured."""

    capacity_blocks = 0

    def __contains__(self, block_hash: BlockHash) -> bool:
        return False

    def offer(self, block_hash: BlockHash, payload: bytes, *, parent: BlockHash | None) -> None:
        pass

    def run_length(self, hashes: Sequence[BlockHash]) -> int:
        return 0

    def get_run_into(self, hashes: Sequence[BlockHash], into: Sequence[memoryview]) -> int:
        return 0

    def read_bytes_per_s(self) -> float:
        return 0.0

    def chains(self, limit: int) -> list[tuple[BlockHash, BlockHash | None]]:
        return []

    def flush(self) -> None:
        pass

    def take_events(self) -> list[CacheEvent]:
        return []

    def has_events(self) -> bool:
        return False

    def writing(self) -> bool:
        return False

    def stats(self) -> None:
        return None

    def close(self) -> None:
        pass


def head_to_tail(held: Sequence[tuple[BlockHash, BlockHash | None]]) -> list[tuple[BlockHash, BlockHash | None]]:
    """(hash, parent) pairs reordered so that each chain runs head to tail (a parent among them comes
    before its children); a block whose parent is not among them starts a chain of its own."""
    parents = dict(held)
    children: dict[BlockHash | None, list[BlockHash]] = {}
    for h, p in held:
        children.setdefault(p if p in parents else None, []).append(h)
    out: list[tuple[BlockHash, BlockHash | None]] = []
    stack = list(reversed(children.get(None, [])))
    while stack:
        h = stack.pop()
        out.append((h, parents[h]))
        stack += reversed(children.get(h, []))
    return out
