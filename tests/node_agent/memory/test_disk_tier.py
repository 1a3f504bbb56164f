"""The disk tier (node_agent/memory/disk): round trips, a hypothesis model of the segment store
against a dict-and-list oracle, capacity, identity, reads into the caller's buffers, metrics, the
write queue's bound and keyed records. Damage and kills: test_disk_crash_safety.py."""

import errno
from dataclasses import replace
from pathlib import Path
from unittest.mock import patch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixmesh.common.metrics.exposition import render_prometheus
from radixmesh.node_agent.memory.disk import segments
from radixmesh.node_agent.memory.disk.record import DiskBlock, DiskIdentity, Dropped, encode
from radixmesh.node_agent.memory.disk.segments import SegmentStore
from radixmesh.node_agent.memory.disk.tier import DiskConfig, DiskTier
from tests.support.disk_blocks import BLOCK, IDENTITY, LAYOUT, PER_SEGMENT, RECORD, blk, h, kv, served, store


def test_round_trip_through_the_writer_and_a_reopen(tmp_path: Path) -> None:
    tier = DiskTier(DiskConfig(tmp_path, capacity_bytes=4 * PER_SEGMENT * RECORD,
                               segment_bytes=PER_SEGMENT * RECORD), IDENTITY)
    for i in range(6):
        tier.offer(h(i), kv(i), parent=h(i - 1) if i else None)
    assert tier.get_run([h(2), h(3)]) == [kv(2), kv(3)]  # queued or written, they are served
    tier.flush()
    assert tier.get_run([h(i) for i in range(7)]) == [kv(i) for i in range(6)]  # up to the first miss
    assert tier.get_run([h(6), h(0)]) == []
    stats = tier.stats()
    assert (stats.disk_writes, stats.disk_write_bytes, stats.disk_blocks, stats.disk_bytes) == (6, 6 * BLOCK, 6, 6 * RECORD)
    tier.close()
    reopened = store(tmp_path)
    assert reopened.hashes() == [h(i) for i in range(6)]
    assert reopened.blocks() == [(h(i), h(i - 1) if i else None) for i in range(6)]  # parents survive
    assert reopened.get(h(5)) == kv(5) and sum(reopened.counters.dropped.values()) == 0
    # Appends after a reopen go to a fresh segment: the old one's tail may be torn.
    reopened.append([blk(6)])
    assert sorted(p.name for p in tmp_path.glob("*.seg")) == ["00000001.seg", "00000002.seg", "00000003.seg"]


def test_capacity_evicts_the_oldest_segment(tmp_path: Path) -> None:
    s = store(tmp_path, segments=2)
    s.append([blk(i) for i in range(9)])  # 3 segments' worth into room for 2
    assert s.hashes() == [h(i) for i in range(4, 9)]
    assert s.counters.evicted == 4 and s.get(h(0)) is None and s.disk_bytes == 5 * RECORD
    s.check_invariants()


def test_a_segment_size_that_leaves_under_two_segments_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="holds fewer than 2 segments"):
        SegmentStore(tmp_path, IDENTITY, capacity_bytes=RECORD * 7, segment_bytes=RECORD * 4)
    assert not list(tmp_path.glob("*.seg"))


def test_another_model_or_cluster_key_is_never_served(tmp_path: Path) -> None:
    s = store(tmp_path)
    s.append([blk(i) for i in range(3)])
    s.close()
    other = store(tmp_path, identity=DiskIdentity.of(LAYOUT, b"another-cluster"))
    assert len(other) == 0 and other.counters.dropped == {Dropped.FOREIGN: 3}
    assert not list(tmp_path.glob("*.seg"))  # a segment with nothing servable is deleted


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.lists(st.integers(0, 20), min_size=1, max_size=7), st.just("reopen")), max_size=12))
def test_the_store_matches_a_fifo_segment_oracle(tmp_path_factory: pytest.TempPathFactory,
                                                 ops: list[list[int] | str]) -> None:
    path = tmp_path_factory.mktemp("disk")
    s = store(path, segments=3)
    segments: list[list[int]] = []  # the oracle: segments oldest first, each the blocks it holds
    active = False  # whether appends continue the newest segment (never after a reopen)
    for op in ops:
        if op == "reopen":
            s.close()
            s = store(path, segments=3)
            active = False
            continue
        assert isinstance(op, list)
        # What the store holds when the append starts is skipped, even if this append evicts it.
        for i in [i for i in dict.fromkeys(op) if not any(i in seg for seg in segments)]:
            if not active or len(segments[-1]) == PER_SEGMENT:
                while len(segments) >= 3:
                    segments.pop(0)
                segments.append([])
                active = True
            segments[-1].append(i)
        s.append([blk(i) for i in op])
        s.check_invariants()
        held = [i for seg in segments for i in seg]
        assert s.hashes() == [h(i) for i in held]
        assert served(s) == {h(i): kv(i) for i in held}
        assert s.get_run([h(i) for i in held]) == [kv(i) for i in held]
        assert all(s.get(h(i)) is None for i in range(21) if i not in held)
    s.close()


def test_a_run_is_read_straight_into_the_callers_buffers(tmp_path: Path) -> None:
    with patch.object(segments, "READ_BYTES", 2 * RECORD):
        s = store(tmp_path, segments=8)
    s.append([blk(i) for i in range(10)])  # three segments: reads of 2 records, split where segments end
    into = [memoryview(bytearray(BLOCK)) for _ in range(7)]
    assert s.get_run_into([h(i) for i in range(9)], into) == 7  # as many as there are buffers
    assert [bytes(b) for b in into] == [kv(i) for i in range(7)]
    assert s.counters.reads == 7 and s.counters.read_bytes == 7 * BLOCK
    assert s.get_run_into([h(5), h(42), h(6)], into) == 1 and into[0] == kv(5)
    assert s.run_length([h(5), h(6), h(42), h(7)]) == 2 and s.run_length([]) == 0


@pytest.mark.parametrize("bad", [b"", bytes(BLOCK), bytearray(BLOCK - 1), bytearray(BLOCK + 1)], ids=repr)
def test_a_destination_that_cannot_take_a_block_is_refused_and_nothing_read(tmp_path: Path, bad: bytes) -> None:
    s = store(tmp_path)
    s.append([blk(0), blk(1)])
    first = bytearray(BLOCK)
    with pytest.raises(ValueError, match="writable, contiguous buffer"):
        s.get_run_into([h(0), h(1)], [memoryview(first), memoryview(bad)])
    assert first == bytearray(BLOCK) and s.counters.reads == 0 and len(s) == 2


def test_the_disk_tier_renders_its_metrics(tmp_path: Path) -> None:
    tier = DiskTier(DiskConfig(tmp_path, capacity_bytes=4 * PER_SEGMENT * RECORD,
                               segment_bytes=PER_SEGMENT * RECORD), IDENTITY)
    tier.offer(h(1), kv(1), parent=None)
    tier.flush()
    assert tier.get_run([h(1), h(2)]) == [kv(1)]
    text = render_prometheus([tier.stats()])
    for sample in ('radixmesh_disk_blocks{tier="disk"} 1.0', 'radixmesh_disk_reads_total{tier="disk"} 1.0',
                   f'radixmesh_disk_write_bytes_total{{tier="disk"}} {float(BLOCK)}',
                   f'radixmesh_disk_capacity_bytes{{tier="disk"}} {float(4 * PER_SEGMENT * RECORD)}',
                   'radixmesh_disk_dropped_blocks_total{reason="torn",tier="disk"} 0.0'):
        assert sample in text, sample
    tier.close()


def test_a_failed_write_loses_only_its_own_blocks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = store(tmp_path)
    s.append([blk(0)])
    real = segments._write_all

    def disk_full(fd: int, buffer: bytearray) -> None:
        real(fd, buffer[: RECORD + 10])  # the first record whole, the second torn
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(segments, "_write_all", disk_full)
    with pytest.raises(OSError):
        s.append([blk(1), blk(2)])
    monkeypatch.setattr(segments, "_write_all", real)
    s.append([blk(3)])
    assert served(s) == {h(0): kv(0), h(3): kv(3)}
    s.close()
    reopened = store(tmp_path)
    # What reached the disk whole is a valid block, found again; the torn record is not.
    assert served(reopened) == {h(0): kv(0), h(1): kv(1), h(3): kv(3)}
    assert reopened.counters.dropped == {Dropped.TORN: 1}


def test_records_of_the_older_format_are_dropped_as_corrupt(tmp_path: Path) -> None:
    """Version 1 records had no parent: a reopened tier drops them, never serves them."""
    s = store(tmp_path)
    s.append([blk(0), blk(1)])
    s.close()
    seg = tmp_path / "00000001.seg"
    data = bytearray(seg.read_bytes())
    data[4:6] = (1).to_bytes(2, "little")  # record 0 claims version 1
    seg.write_bytes(bytes(data))
    reopened = store(tmp_path)
    assert reopened.hashes() == [h(1)] and reopened.counters.dropped[Dropped.CORRUPT] == 1
    reopened.check_invariants()


def test_chains_run_head_to_tail_whatever_the_order_on_disk(tmp_path: Path) -> None:
    """The host demotes a chain tail first; what a restarted node announces runs parents first, and
    a limit keeps the newest blocks (a block whose parent was left out heads its own chain)."""
    tier = DiskTier(DiskConfig(tmp_path, capacity_bytes=4 * PER_SEGMENT * RECORD,
                               segment_bytes=PER_SEGMENT * RECORD), IDENTITY)
    # Chain 0-1-2-3 written tail first, then a second root 10 with child 11.
    for b in [blk(3), blk(2), blk(1), blk(0), DiskBlock(h(10), kv(10), None), DiskBlock(h(11), kv(11), h(10))]:
        tier.offer(b.block_hash, b.payload, parent=b.parent)
    tier.flush()
    assert tier.chains(100) == [(h(0), None), (h(1), h(0)), (h(2), h(1)), (h(3), h(2)), (h(10), None),
                                (h(11), h(10))]
    assert tier.chains(3) == [(h(0), None), (h(10), None), (h(11), h(10))]
    assert tier.chains(4) == [(h(0), None), (h(1), h(0)), (h(10), None), (h(11), h(10))]
    assert tier.chains(1) == [(h(11), h(10))]  # its parent left out: it still names it
    assert tier.chains(0) == []
    tier.close()


def test_the_write_queue_is_bounded_in_bytes(tmp_path: Path) -> None:
    """Issue 38 item 8: the queue was 4,096 blocks whatever their size (8 GiB of 2 MiB blocks)."""
    tier = DiskTier(DiskConfig(tmp_path, capacity_bytes=4 * PER_SEGMENT * RECORD, segment_bytes=PER_SEGMENT * RECORD,
                               queue_bytes=3 * BLOCK), IDENTITY)
    with tier.store._lock:  # a disk that does not keep up: the writer waits here inside its first append
        for i in range(6):
            tier.offer(h(i), kv(i), parent=None)
        assert tier.offers_dropped == 3 and [h(i) in tier for i in range(6)] == [True] * 3 + [False] * 3
    tier.flush()
    tier.offer(h(6), kv(6), parent=None)  # written, the queue has room again
    tier.flush()
    assert tier.stats().disk_blocks == 4 and tier.offers_dropped == 3
    tier.close()
    with pytest.raises(ValueError, match="queue_bytes >= 1"):
        DiskConfig(tmp_path, capacity_bytes=1 << 20, queue_bytes=0)


def test_a_record_forged_without_the_key_is_never_served_and_is_counted(tmp_path: Path) -> None:
    """Issue 38 item 6: with an unkeyed CRC-32, records written by whoever could write the directory
    (every header field copied from a real record) were served after a restart."""
    s = store(tmp_path)
    s.append([blk(0)])
    s.close()
    forger = replace(IDENTITY, record_key=bytes(32))  # every field a real record shows, but not the key
    forged = bytearray()
    for i in (1, 2):
        encode(forger, DiskBlock(h(i), kv(i + 100), h(i - 1)), forged)
    with open(tmp_path / "00000001.seg", "ab") as f:
        f.write(forged)
    reopened = store(tmp_path)
    assert served(reopened) == {h(0): kv(0)} and h(1) not in reopened
    assert reopened.counters.dropped == {Dropped.CORRUPT: 2}
    assert "record_key" not in repr(IDENTITY) and IDENTITY.record_key.hex() not in repr(IDENTITY)
