"""Segment files and their index: the disk tier's storage, synchronous and thread-safe.

    dir/00000007.seg   [record 0][record 1]...[record n-1]     n = records_per_segment
    dir/00000008.seg   [record 0]...[record k-1]  <- the one being appended to

Records have one size, segments are written once and never rewritten, the index (block hash ->
segment, slot) is rebuilt by `open` from verified records, and the oldest segment goes to make
room. One lock guards the index and open files; appends write outside it. Why each:
docs/memory.md#disk-segments.
"""

import os
import threading
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from radixmesh.node_agent.memory.disk.directory import SegmentDirectory
from radixmesh.node_agent.memory.disk.record import (
    HEADER_BYTES,
    DiskBlock,
    DiskIdentity,
    Dropped,
    decode,
    encode,
    verify,
)
from radixmesh.proto.block_hash import BlockHash

SCAN_BYTES = 8 << 20
"""Bytes read at once re-indexing the segments."""
READ_BYTES = 1 << 20
"""Bytes (whole records, at least one) one preadv of a served run reads at most; READS_AHEAD: how
many of them READERS threads may issue past the one being verified. Measured over a 256 MiB run of
720 KiB blocks, page cache dropped (plain 8 MiB reads: 3.3 GB/s). Written in file order: reads of 1
record 4 ahead 2.75 GB/s, 2 records 2 ahead 2.4, 11 records 1 ahead 2.5, all ahead (unbounded) 2.0,
no reader thread 2.0; 4 readers instead of 1: 2.4 against 2.5 (noise). Written tail first, as the
host demotes a chain (the kernel's readahead does not follow reads backwards): 1 reader 1.0 GB/s,
2 readers 1.6, 4 readers 2.0 (the device serves several reads at once). Bounded, the bytes verified
are still in the CPU's cache: with the pages cached, 6.2 GB/s against 2.3 unbounded and 4.1
without a reader thread."""
READS_AHEAD = 4
READERS = 4
_IOVECS = os.sysconf("SC_IOV_MAX")


class Slot(NamedTuple):
    segment: int
    position: int


@dataclass(slots=True)
class DiskCounters:
    """Live counts of one store (its owner snapshots them into DiskStats)."""

    reads: int = 0
    read_bytes: int = 0
    read_seconds: float = 0.0
    writes: int = 0
    write_bytes: int = 0
    write_seconds: float = 0.0
    evicted: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    """Records not served, by record.Dropped reason: found by `open`'s scan or by a read."""


class SegmentStore:
    """Blocks of one DiskIdentity in segment files under `path`, at most `capacity_bytes` of them."""

    def __init__(self, path: Path, identity: DiskIdentity, capacity_bytes: int, segment_bytes: int) -> None:
        """Open (creating) the directory and re-index every segment in it (see `_open`); the errors
        of SegmentDirectory when it cannot be trusted or another agent holds it."""
        self.identity = identity
        self.records_per_segment = max(1, segment_bytes // identity.record_bytes)
        self.segment_bytes = self.records_per_segment * identity.record_bytes
        self.max_segments = capacity_bytes // self.segment_bytes
        if self.max_segments < 2:
            raise ValueError(f"disk capacity {capacity_bytes} bytes holds fewer than 2 segments of "
                             f"{self.segment_bytes} bytes; give it more room or smaller segments")
        self.path = path
        self._run_records = max(1, min(READ_BYTES // identity.record_bytes, _IOVECS // 2))
        """Records one preadv of a run reads at most (two iovecs each: header, payload)."""
        self._reader = ThreadPoolExecutor(READERS, thread_name_prefix="radixmesh-disk-reader")
        """Issues a run's preadvs, ahead of the thread verifying them."""
        self.counters = DiskCounters()
        self._lock = threading.Lock()
        self._index: dict[BlockHash, Slot] = {}
        self._parents: dict[BlockHash, BlockHash | None] = {}
        """The parent each indexed block's record names (same keys as _index)."""
        self._segments: dict[int, list[BlockHash | None]] = {}
        """Every segment on disk, oldest first (dicts keep insertion order), and the hash in each of
        its slots (None: a record that failed verification)."""
        self._readers: dict[int, int] = {}
        self._evicted: list[BlockHash] = []
        """Blocks appends evicted since the last `take_evicted`."""
        self._active: tuple[int, int] | None = None
        """(segment, records written) of the segment appends go to; None: the next append opens one."""
        self.directory = SegmentDirectory(path)
        try:
            self._open()
        except BaseException:
            self.close()
            raise
        self._evicted.clear()  # what the re-index dropped was never announced

    # --- reads -------------------------------------------------------------------------------
    def __contains__(self, block_hash: BlockHash) -> bool:
        return block_hash in self._index

    def __len__(self) -> int:
        return len(self._index)

    @property
    def disk_bytes(self) -> int:
        with self._lock:
            return sum(len(held) for held in self._segments.values()) * self.identity.record_bytes

    def get(self, block_hash: BlockHash) -> memoryview | None:
        """The KV bytes of `block_hash`, verified; None if absent or if its record fails (it is then
        dropped from the index and counted)."""
        got = self.get_run([block_hash])
        return got[0] if got else None

    def get_run(self, hashes: Sequence[BlockHash]) -> list[memoryview]:
        """`get_run_into` fresh buffers: the KV bytes of the longest prefix of `hashes` held here and
        verified, in order, each its own writable buffer."""
        into = [memoryview(bytearray(self.identity.block_bytes)) for _ in range(self.run_length(hashes))]
        return into[: self.get_run_into(hashes, into)]

    def run_length(self, hashes: Sequence[BlockHash]) -> int:
        """How many of `hashes`, from the first, are indexed here: the most a read of them serves."""
        n = 0
        while n < len(hashes) and hashes[n] in self._index:
            n += 1
        return n

    def destinations(self, into: Sequence[memoryview]) -> list[memoryview]:
        """`into` as byte views a read may fill; ValueError unless each is a writable, contiguous
        buffer of exactly identity.block_bytes."""
        views = list(into)
        size = self.identity.block_bytes
        for k, view in enumerate(views):
            if view.readonly or not view.c_contiguous or view.nbytes != size:
                raise ValueError(f"destination {k} must be a writable, contiguous buffer of {size} bytes, got "
                                 f"{view.nbytes} bytes ({'read-only' if view.readonly else 'writable'}, "
                                 f"{'contiguous' if view.c_contiguous else 'strided'})")
        return [view.cast("B") if view.format != "B" or view.ndim != 1 else view for view in views]

    def get_run_into(self, hashes: Sequence[BlockHash], into: Sequence[memoryview]) -> int:
        """Read the longest prefix of `hashes` held here and verified, at most len(into) blocks, block
        k's KV bytes into into[k] (see `destinations`); returns how many were served. A destination
        past that count may hold any bytes: never use it.

        Records that lie one after another in a segment, as a demoted chain's do (in either order:
        the host demotes a chain tail first), are read together, READ_BYTES a preadv, headers to a scratch buffer and payloads straight into their
        destinations (no copy after the kernel's). Reader threads issue the next preadvs while
        this thread verifies what has arrived (preadv and zlib.crc32 release the GIL), so the device
        and the checksum work at once. The first record that fails verification (a short read: torn)
        is dropped from the index, counted, and ends the run; reads not yet started are cancelled."""
        views = self.destinations(into)
        size = self.identity.record_bytes
        heads = memoryview(bytearray(HEADER_BYTES * len(views)))
        served = 0
        with self._lock:
            slots: list[Slot] = []
            for block_hash in hashes[: len(views)]:
                slot = self._index.get(block_hash)
                if slot is None:
                    break
                slots.append(slot)
            t0 = time.perf_counter()
            reads = self._contiguous(slots, self._run_records)

            def read(i: int, j: int) -> int:
                iovecs: list[memoryview] = []
                for k in sorted(range(i, j), key=lambda k: slots[k].position):  # in file order
                    iovecs += (heads[k * HEADER_BYTES: (k + 1) * HEADER_BYTES], views[k])
                return os.preadv(self._readers[slots[i].segment], iovecs, first_position(i, j) * size)

            def first_position(i: int, j: int) -> int:
                return min(slots[i].position, slots[j - 1].position)

            futures: list[Future[int]] = []
            try:
                for n, (i, j) in enumerate(reads):
                    for a, b in reads[len(futures): n + 1 + READS_AHEAD]:
                        futures.append(self._reader.submit(read, a, b))
                    got = futures[n].result()
                    for k in range(i, j):
                        whole = got >= (slots[k].position - first_position(i, j) + 1) * size
                        result = (verify(self.identity, heads[k * HEADER_BYTES: (k + 1) * HEADER_BYTES], views[k])
                                  if whole else Dropped.TORN)
                        if isinstance(result, Dropped) or result.block_hash != hashes[k]:
                            self.counters.dropped[result if isinstance(result, Dropped) else Dropped.FOREIGN] += 1
                            del self._index[hashes[k]], self._parents[hashes[k]]
                            break
                        served += 1
                    if served < j:
                        break
            finally:  # no preadv may outlive the lock or write a destination the caller reuses
                for future in futures:
                    future.cancel()
                wait(futures)
            self.counters.reads += served
            self.counters.read_bytes += served * self.identity.block_bytes
            self.counters.read_seconds += time.perf_counter() - t0
        return served

    def _contiguous(self, slots: list[Slot], limit: int) -> list[tuple[int, int]]:
        """Split `slots` into reads [i, j): records of one segment next to each other, at most `limit`
        each, in file order (records [position_i, position_i + j - i) of that segment's file) or in
        reverse (records (position_i - (j - i), position_i])."""
        reads: list[tuple[int, int]] = []
        i = 0
        while i < len(slots):
            j = i + 1
            step = slots[j].position - slots[i].position if j < len(slots) else 0
            while (j < len(slots) and j - i < limit and step in (1, -1)
                   and slots[j] == Slot(slots[i].segment, slots[i].position + step * (j - i))):
                j += 1
            reads.append((i, j))
            i = j
        return reads

    # --- writes ------------------------------------------------------------------------------
    def append(self, blocks: Sequence[DiskBlock]) -> list[DiskBlock]:
        """Write `blocks` (hashes already held are skipped), evicting the oldest segments past the
        capacity (`take_evicted` says which); each segment's share is one write. Returns the blocks
        written. Only one thread may append."""
        todo: dict[BlockHash, DiskBlock] = {b.block_hash: b for b in blocks if b.block_hash not in self._index}
        pending = list(todo.values())
        while pending:
            with self._lock:
                segment, start, fd = self._writable()
            n = min(len(pending), self.records_per_segment - start)
            chunk, pending = pending[:n], pending[n:]
            buffer = bytearray()
            for block in chunk:
                encode(self.identity, block, buffer)
            t0 = time.perf_counter()
            try:
                _write_all(fd, buffer)
            except OSError:
                # The file may now end inside a record: slots past it would be misplaced, so the
                # next append starts a fresh segment (the scan drops the torn tail on reopen).
                with self._lock:
                    self._active = None
                raise
            elapsed = time.perf_counter() - t0
            with self._lock:
                self._publish(segment, start, chunk)
                self.counters.writes += n
                self.counters.write_bytes += n * self.identity.block_bytes
                self.counters.write_seconds += elapsed
        return list(todo.values())

    def take_evicted(self) -> list[BlockHash]:
        """The blocks appends evicted since the last call."""
        with self._lock:
            evicted, self._evicted = self._evicted, []
        return evicted

    def close(self) -> None:
        """Close the files and release the directory for another agent. Idempotent."""
        self._reader.shutdown()
        with self._lock:
            for fd in self._readers.values():
                os.close(fd)
            self._readers.clear()
            self._active = None
            self.directory.close()

    def clear(self) -> list[BlockHash]:
        """Delete every segment file and forget every block (a prefix-cache reset); returns the hashes
        that were held. Only the appending thread's owner may call it, with no append running."""
        with self._lock:
            dropped = list(self._index)
            for segment in list(self._segments):
                os.close(self._readers.pop(segment))
                self.directory.unlink(segment)
            self._segments.clear()
            self._index.clear()
            self._parents.clear()
            self._active = None
        return dropped

    def hashes(self) -> list[BlockHash]:
        """Every block held, oldest segment first."""
        return [h for h, _ in self.blocks()]

    def blocks(self) -> list[tuple[BlockHash, BlockHash | None]]:
        """(hash, parent) of every block held, oldest segment first."""
        with self._lock:
            return [(h, self._parents[h]) for segment, held in self._segments.items() for i, h in enumerate(held)
                    if h is not None and self._index.get(h) == Slot(segment, i)]

    def check_invariants(self) -> None:
        with self._lock:
            assert len(self._segments) <= self.max_segments, (len(self._segments), self.max_segments)
            for block_hash, slot in self._index.items():
                assert self._segments[slot.segment][slot.position] == block_hash, (block_hash, slot)
            assert self._parents.keys() == self._index.keys(), (len(self._parents), len(self._index))

    # --- internals (lock held) ---------------------------------------------------------------
    def _writable(self) -> tuple[int, int, int]:
        """(segment, first free slot, fd) of the segment to append to, starting one if needed."""
        if self._active is None or self._active[1] == self.records_per_segment:
            while len(self._segments) >= self.max_segments:
                self._evict_oldest()
            segment, fd = self.directory.create(max(self._segments, default=0))
            self._segments[segment] = []
            self._readers[segment] = fd
            self._active = (segment, 0)
        segment, start = self._active
        return segment, start, self._readers[segment]

    def _publish(self, segment: int, start: int, blocks: list[DiskBlock]) -> None:
        # Only appends recycle segments, and they come from one thread: this one is still here.
        held = self._segments[segment]
        assert len(held) == start, (len(held), start)
        for i, block in enumerate(blocks):
            held.append(block.block_hash)
            self._index[block.block_hash] = Slot(segment, start + i)
            self._parents[block.block_hash] = block.parent
        self._active = (segment, start + len(blocks))

    def _evict_oldest(self) -> None:
        segment = next(iter(self._segments))
        for block_hash in self._segments.pop(segment):
            if block_hash is not None and self._index.get(block_hash, (None,))[0] == segment:
                del self._index[block_hash], self._parents[block_hash]
                self.counters.evicted += 1
                self._evicted.append(block_hash)
        os.close(self._readers.pop(segment))
        self.directory.unlink(segment)

    def _open(self) -> None:
        """Re-index the segments already here, oldest first: every record is read and verified;
        failed ones are counted and skipped, a segment with nothing valid is deleted, and appends
        go to a fresh segment (a crash may have torn the last one's tail)."""
        size = self.identity.record_bytes
        chunk = max(1, SCAN_BYTES // size)
        buffer = memoryview(bytearray(chunk * size))
        for segment, fd in self.directory.segments():
            whole, tail = divmod(os.fstat(fd).st_size, size)
            if tail:
                self.counters.dropped[Dropped.TORN] += 1
            # Records past records_per_segment (written with larger segments) are left unread.
            whole = min(whole, self.records_per_segment)
            held: list[BlockHash | None] = []
            for first in range(0, whole, chunk):
                count = min(chunk, whole - first)
                read = os.preadv(fd, [buffer[: count * size]], first * size)
                for i in range(count):
                    got = decode(self.identity, buffer[i * size: min((i + 1) * size, read)])
                    if isinstance(got, Dropped):
                        self.counters.dropped[got] += 1
                        held.append(None)
                        continue
                    held.append(got.block_hash)
                    self._index[got.block_hash] = Slot(segment, first + i)
                    self._parents[got.block_hash] = got.parent
            if not any(h is not None and self._index.get(h, (None,))[0] == segment for h in held):
                os.close(fd)
                self.directory.unlink(segment)
                continue
            self._segments[segment] = held
            self._readers[segment] = fd
        while len(self._segments) > self.max_segments:  # the capacity shrank since they were written
            self._evict_oldest()


def _write_all(fd: int, buffer: bytearray) -> None:
    view = memoryview(buffer)
    while view:
        view = view[os.write(fd, view):]

