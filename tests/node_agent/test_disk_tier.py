"""The disk tier (node_agent/memory/disk): round trips, a hypothesis model of the segment store
against a dict-and-list oracle, capacity, identity, and crash safety: seeded bit flips and
truncations of the segment files, and a writer process killed with SIGKILL mid-write, many times.
After each, a reopened store serves only blocks that verify and counts the ones it dropped; a run
read into the caller's buffers stops at the first record damaged since the open, like an oracle."""

import errno
import random
import subprocess
import sys
import textwrap
import time
from dataclasses import asdict, replace
from pathlib import Path
from unittest.mock import patch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixmesh.common.metrics.exposition import render_prometheus
from radixmesh.node_agent.memory.disk import segments
from radixmesh.node_agent.memory.disk.record import HEADER_BYTES, DiskBlock, DiskIdentity, Dropped, encode
from radixmesh.node_agent.memory.disk.segments import SegmentStore
from radixmesh.node_agent.memory.disk.tier import DiskConfig, DiskTier
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.kv_layout import KVLayout

LAYOUT = KVLayout("tiny-test", num_layers=1, num_kv_heads=1, head_dim=2, dtype="float32", block_size=4)
IDENTITY = DiskIdentity.of(LAYOUT, b"cluster-key")
BLOCK = LAYOUT.block_bytes  # 64 bytes of KV, 144 with the header
RECORD = IDENTITY.record_bytes
PER_SEGMENT = 4
BIG = KVLayout("tiny-test", num_layers=4, num_kv_heads=2, head_dim=64, dtype="float32", block_size=16)
"""64 KiB blocks, for the kill test's large writes."""


def h(i: int) -> BlockHash:
    return BlockHash(i.to_bytes(16, "little"))


def kv(i: int, size: int = BLOCK) -> bytes:
    """The block of h(i): its bytes are a function of i, so a wrong block is told from a right one."""
    return (i.to_bytes(8, "little") * (size // 8 + 1))[:size]


def blk(i: int) -> DiskBlock:
    """Block i of one chain: h(i) under h(i - 1)."""
    return DiskBlock(h(i), kv(i), h(i - 1) if i else None)


def store(path: Path, segments: int = 4, identity: DiskIdentity = IDENTITY) -> SegmentStore:
    return SegmentStore(path, identity, capacity_bytes=segments * PER_SEGMENT * RECORD,
                        segment_bytes=PER_SEGMENT * RECORD)


def served(s: SegmentStore) -> dict[BlockHash, memoryview]:
    """Everything `s` serves; asserts each block is the one written under its hash."""
    got = {b: s.get(b) for b in s.hashes()}
    for b, payload in got.items():
        assert payload == kv(int.from_bytes(b, "little"), s.identity.block_bytes), b
    return {b: p for b, p in got.items() if p is not None}


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


@pytest.mark.parametrize("seed", range(8))
def test_flipped_bits_and_a_torn_tail_are_dropped_and_counted(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    s = store(tmp_path, segments=8)
    s.append([blk(i) for i in range(14)])  # segments 1..3 full, 4 holds two
    s.close()
    files = sorted(tmp_path.glob("*.seg"))
    damaged = rng.sample(range(12), 3)  # records of the full segments, anywhere in them (header or KV)
    for r in damaged:
        f = files[r // PER_SEGMENT]
        data = bytearray(f.read_bytes())
        at = (r % PER_SEGMENT) * RECORD + rng.randrange(RECORD)
        data[at] ^= 1 << rng.randrange(8)
        f.write_bytes(data)
    last = files[-1]
    cut = rng.randrange(RECORD + 1, 2 * RECORD)  # the second record of the last segment is torn
    last.write_bytes(last.read_bytes()[:cut])
    reopened = store(tmp_path, segments=8)
    assert set(served(reopened)) == {h(i) for i in range(13) if i not in damaged}
    assert reopened.counters.dropped[Dropped.TORN] == 1
    assert reopened.counters.dropped[Dropped.CORRUPT] + reopened.counters.dropped[Dropped.FOREIGN] == 3


def test_a_record_damaged_after_the_scan_is_dropped_at_read(tmp_path: Path) -> None:
    s = store(tmp_path)
    s.append([blk(i) for i in range(2)])
    f = next(tmp_path.glob("*.seg"))
    data = bytearray(f.read_bytes())
    data[RECORD + HEADER_BYTES + 5] ^= 0x10  # block 1's KV
    f.write_bytes(data)
    assert s.get_run([h(0), h(1), h(2)]) == [kv(0)]  # read in one pread, cut at the bad record
    assert h(1) not in s and s.counters.dropped == {Dropped.CORRUPT: 1}
    assert s.counters.reads == 1 and s.get(h(1)) is None


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


_KINDS = ("flip", "swap", "cut")


@settings(max_examples=100, deadline=None)
@given(records=st.integers(1, 12), damage=st.dictionaries(st.integers(0, 11), st.sampled_from(_KINDS), max_size=3),
       reverse=st.booleans(), read_records=st.integers(1, 5), ahead=st.integers(0, 3), asked=st.integers(0, 14),
       buffers=st.integers(0, 14))
def test_a_run_read_stops_at_the_first_damaged_record_like_the_oracle(
        tmp_path_factory: pytest.TempPathFactory, records: int, damage: dict[int, str], reverse: bool,
        read_records: int, ahead: int, asked: int, buffers: int) -> None:
    """Blocks 0..records-1 of a chain, written head first or tail first (as the host demotes), their
    records damaged after the store opened (a flipped bit, another block's record in the slot, a
    file cut inside a record), read in runs of any read size and lookahead: the run serves exactly
    the blocks before the first damaged one, each byte for byte, drops and counts that one (and no
    other), and leaves the rest indexed."""
    path = tmp_path_factory.mktemp("disk")
    with patch.object(segments, "READ_BYTES", read_records * RECORD):
        s = store(path, segments=8)
    order = list(range(records))[::-1] if reverse else list(range(records))  # order[slot] = block
    s.append([blk(i) for i in order])
    files = sorted(path.glob("*.seg"))
    data = [bytearray(f.read_bytes()) for f in files]
    original = [bytes(d) for d in data]
    bad: dict[int, Dropped] = {}  # block -> why a read drops it
    cuts: dict[int, int] = {}
    for b, kind in damage.items():
        if b >= records or (kind == "swap" and records == 1):
            continue
        seg, at = divmod(order.index(b), PER_SEGMENT)
        if kind == "flip":
            data[seg][at * RECORD + (b * 7919) % RECORD] ^= 1 << (b % 8)
            bad[b] = Dropped.CORRUPT
        elif kind == "swap":  # a whole, valid record of another block
            qs, qa = divmod(order.index(b + 1 if b + 1 < records else b - 1), PER_SEGMENT)
            data[seg][at * RECORD: (at + 1) * RECORD] = original[qs][qa * RECORD: (qa + 1) * RECORD]
            bad[b] = Dropped.FOREIGN
        else:
            cuts[seg] = min(cuts.get(seg, at), at)
    for seg, at in cuts.items():
        del data[seg][at * RECORD + RECORD // 2:]
        bad |= dict.fromkeys(order[seg * PER_SEGMENT + at: (seg + 1) * PER_SEGMENT], Dropped.TORN)
    for f, d in zip(files, data, strict=True):
        f.write_bytes(d)
    into = [memoryview(bytearray(BLOCK)) for _ in range(buffers)]
    reach = min(asked, buffers, records)
    stop = min([r for r in bad if r < reach], default=None)
    with patch.object(segments, "READS_AHEAD", ahead):
        got = s.get_run_into([h(i) for i in range(asked)], into)
    assert got == (reach if stop is None else stop)
    assert [bytes(b) for b in into[:got]] == [kv(i) for i in range(got)]
    assert s.counters.dropped == ({} if stop is None else {bad[stop]: 1})
    assert set(s.hashes()) == {h(i) for i in range(records) if i != stop}
    s.check_invariants()
    s.close()


_WRITER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from radixmesh.node_agent.memory.disk import segments
    from radixmesh.node_agent.memory.disk.record import DiskIdentity
    from radixmesh.node_agent.memory.disk.tier import DiskConfig, DiskTier

    IDENTITY = DiskIdentity(**FIELDS)
    RECORD = IDENTITY.record_bytes
    SIZE = IDENTITY.block_bytes
    h = lambda i: i.to_bytes(16, "little")
    kv = lambda i: (i.to_bytes(8, "little") * (SIZE // 8 + 1))[:SIZE]
    start, tear_at = int(sys.argv[2]), int(sys.argv[3])
    writes = 0
    whole = segments._write_all

    def tearing(fd, buffer):
        # The tear_at-th write stops inside a record and waits to be killed there: a kill that
        # certainly lands mid-write, whatever the box's timing (the seeded kills may all miss).
        global writes
        writes += 1
        if writes != tear_at:
            return whole(fd, buffer)
        whole(fd, memoryview(buffer)[: len(buffer) // 2 + 7])
        print("torn", flush=True)
        sys.stdin.readline()

    segments._write_all = tearing
    tier = DiskTier(DiskConfig(Path(sys.argv[1]), capacity_bytes=1 << 30, segment_bytes=128 * RECORD), IDENTITY)
    i = start
    while True:
        for _ in range(64):  # 4 MiB: a seeded kill often lands inside a write
            tier.offer(h(i), kv(i), parent=None)
            i += 1
        tier.flush()
        print(i, flush=True)  # every block below i is written
""")


@pytest.mark.slow
def test_a_writer_killed_mid_write_never_serves_a_bad_block(tmp_path: Path) -> None:
    """SIGKILL of a writer that never stops writing, at seeded instants and (every other kill)
    inside a write; each restart reopens the directory (and goes on writing after what it holds),
    so later kills land among older segments."""
    rng = random.Random(29)
    identity = DiskIdentity.of(BIG, b"cluster-key")
    segment_bytes = 128 * identity.record_bytes
    acknowledged = 0
    torn_files: set[str] = set()
    root = Path(__file__).resolve().parents[2]
    for kill in range(12):
        torn = {f.name for f in tmp_path.glob("*.seg") if f.stat().st_size % identity.record_bytes}
        with_store = SegmentStore(tmp_path, identity, 1 << 30, segment_bytes)
        assert set(served(with_store)) >= {h(i) for i in range(acknowledged)}
        assert with_store.counters.dropped == ({Dropped.TORN: len(torn)} if torn else {})
        torn_files |= torn
        with_store.close()
        writes = rng.randrange(1, 4)
        tear_at = writes + 1 if kill % 2 else 0
        script = f"FIELDS = {asdict(identity)!r}\n{_WRITER}"
        child = subprocess.Popen([sys.executable, "-c", script, str(tmp_path), str(acknowledged), str(tear_at)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=root)
        assert child.stdout is not None
        if tear_at:  # a flush may span two segments (two writes): acknowledgements until the tear
            while (line := child.stdout.readline().strip()) != "torn":
                acknowledged = int(line)
        else:
            for _ in range(writes):
                acknowledged = int(child.stdout.readline())
            # Not a wait for anything: a seeded instant to kill at, within the next 4 MiB write or two.
            time.sleep(rng.uniform(0, 0.004))
        child.kill()
        child.wait()
    torn_files |= {f.name for f in tmp_path.glob("*.seg") if f.stat().st_size % identity.record_bytes}
    final = SegmentStore(tmp_path, identity, 1 << 30, segment_bytes)
    assert set(served(final)) >= {h(i) for i in range(acknowledged)}
    # Torn tails are the only damage a kill can do; each is counted once per reopen that finds it.
    assert set(final.counters.dropped) <= {Dropped.TORN}
    assert len(torn_files) >= 6, f"only {len(torn_files)} torn segments after 6 kills inside a write"


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
