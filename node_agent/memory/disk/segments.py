"""Segment files and their index: the disk tier's storage, synchronous and thread-safe.

    dir/00000007.seg   [record 0][record 1]...[record n-1]     n = records_per_segment
    dir/00000008.seg   [record 0]...[record k-1]  <- the one being appended to

Records have one size (record.DiskIdentity.record_bytes), so record i of a segment is at
i * record_bytes: a damaged record costs only itself, and a scan never loses its footing.
Segments are written once, front to back, in large sequential writes, and never rewritten; the
index (block hash -> segment, slot) lives in memory and is rebuilt by `open`, which verifies every
record and drops (never serves) those that fail. Capacity is a whole number of segments; the
oldest segment is deleted to make room (FIFO by segment: cheap, and demotions arrive in roughly
the order the host tier stops wanting them).

Locking: one lock guards the index and the open files; the bytes of an append are written outside
it (only the writer thread appends), so reads are never held up behind a large write.
"""

import os
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from radixmesh.node_agent.memory.disk.record import DiskBlock, DiskIdentity, Dropped, decode, encode
from radixmesh.proto.block_hash import BlockHash

SUFFIX = ".seg"
SCAN_BYTES = 8 << 20
"""Bytes read at once, re-indexing or serving a run."""


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
        """Open (creating) the directory and re-index every segment in it (see `_open`)."""
        self.identity = identity
        self.records_per_segment = max(1, segment_bytes // identity.record_bytes)
        self.segment_bytes = self.records_per_segment * identity.record_bytes
        self.max_segments = capacity_bytes // self.segment_bytes
        if self.max_segments < 2:
            raise ValueError(f"disk capacity {capacity_bytes} bytes holds fewer than 2 segments of "
                             f"{self.segment_bytes} bytes; give it more room or smaller segments")
        self.path = path
        self._read_records = max(1, SCAN_BYTES // identity.record_bytes)
        self._buffer = memoryview(bytearray(self._read_records * identity.record_bytes))
        """Where every read lands (under the lock), reused: a fresh buffer per read costs its page
        faults and zeroing, measured at half the disk's sequential read rate."""
        self.counters = DiskCounters()
        self._lock = threading.Lock()
        self._index: dict[BlockHash, Slot] = {}
        self._parents: dict[BlockHash, BlockHash | None] = {}
        """The parent each indexed block's record names (same keys as _index)."""
        self._segments: dict[int, list[BlockHash | None]] = {}
        """Every segment on disk, oldest first (dicts keep insertion order), and the hash in each of
        its slots (None: a record that failed verification)."""
        self._readers: dict[int, int] = {}
        self._active: tuple[int, int] | None = None
        """(segment, records written) of the segment appends go to; None: the next append opens one."""
        path.mkdir(parents=True, exist_ok=True)
        self._open()

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
        """The KV bytes of the longest prefix of `hashes` held here and verified, in order (each its
        own writable buffer). Records that lie one after another in a segment, as a demoted chain's
        do, are read together, ~8 MiB per pread; the first that fails verification is dropped from
        the index, counted, and ends the run."""
        size = self.identity.record_bytes
        payloads: list[memoryview] = []
        with self._lock:
            slots: list[Slot] = []
            for block_hash in hashes:
                slot = self._index.get(block_hash)
                if slot is None:
                    break
                slots.append(slot)
            t0 = time.perf_counter()
            for i, j in self._contiguous(slots):
                view = self._buffer[: (j - i) * size]
                view = view[: os.preadv(self._readers[slots[i].segment], [view], slots[i].position * size)]
                for k in range(i, j):
                    got = decode(self.identity, view[(k - i) * size: (k - i + 1) * size])
                    if isinstance(got, Dropped) or got.block_hash != hashes[k]:
                        self.counters.dropped[got if isinstance(got, Dropped) else Dropped.FOREIGN] += 1
                        del self._index[hashes[k]], self._parents[hashes[k]]
                        break
                    payloads.append(memoryview(bytearray(got.payload)))
                if len(payloads) < j:
                    break
            self.counters.reads += len(payloads)
            self.counters.read_bytes += len(payloads) * self.identity.block_bytes
            self.counters.read_seconds += time.perf_counter() - t0
        return payloads

    def _contiguous(self, slots: list[Slot]) -> list[tuple[int, int]]:
        """Split `slots` into reads [i, j): consecutive records of one segment, at most
        _read_records each (records [position_i, position_i + j - i) of that segment's file)."""
        reads: list[tuple[int, int]] = []
        i = 0
        while i < len(slots):
            j = i + 1
            while (j < len(slots) and j - i < self._read_records
                   and slots[j] == Slot(slots[i].segment, slots[i].position + j - i)):
                j += 1
            reads.append((i, j))
            i = j
        return reads

    # --- writes ------------------------------------------------------------------------------
    def append(self, blocks: Sequence[DiskBlock]) -> None:
        """Write `blocks` (hashes already held are skipped), evicting the oldest segments past the
        capacity; each segment's share is one write. Only one thread may append."""
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

    def close(self) -> None:
        with self._lock:
            for fd in self._readers.values():
                os.close(fd)
            self._readers.clear()
            self._active = None

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
            segment = max(self._segments, default=0) + 1
            while len(self._segments) >= self.max_segments:
                self._evict_oldest()
            fd = os.open(self._file(segment), os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
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
        os.close(self._readers.pop(segment))
        self._file(segment).unlink(missing_ok=True)

    def _file(self, segment: int) -> Path:
        return self.path / f"{segment:08d}{SUFFIX}"

    def _open(self) -> None:
        """Re-index the segments already here, oldest first: every record is read and verified;
        failed ones are counted and skipped, a segment with nothing valid is deleted, and appends
        go to a fresh segment (a crash may have torn the last one's tail)."""
        found = sorted(int(f.stem) for f in self.path.glob(f"*{SUFFIX}") if f.stem.isdigit())
        size = self.identity.record_bytes
        chunk = self._read_records
        buffer = self._buffer
        for segment in found:
            fd = os.open(self._file(segment), os.O_RDONLY)
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
                self._file(segment).unlink()
                continue
            self._segments[segment] = held
            self._readers[segment] = fd
        while len(self._segments) > self.max_segments:  # the capacity shrank since they were written
            self._evict_oldest()


def _write_all(fd: int, buffer: bytearray) -> None:
    view = memoryview(buffer)
    while view:
        view = view[os.write(fd, view):]

