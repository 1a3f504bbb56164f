"""Crash safety of the disk tier: seeded bit flips and truncations of the segment files, and a writer
process killed with SIGKILL mid-write, many times. After each, a reopened store serves only blocks
that verify and counts the ones it dropped; a run read into the caller's buffers stops at the first
record damaged since the open, like an oracle."""

import random
import subprocess
import sys
import textwrap
import time
from dataclasses import asdict
from pathlib import Path
from unittest.mock import patch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixmesh.node_agent.memory.disk import segments
from radixmesh.node_agent.memory.disk.record import HEADER_BYTES, DiskIdentity, Dropped
from radixmesh.node_agent.memory.disk.segments import SegmentStore
from tests.support.disk_blocks import BIG, BLOCK, PER_SEGMENT, RECORD, blk, h, kv, served, store


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
    root = Path(__file__).resolve().parents[3]
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
