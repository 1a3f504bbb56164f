"""The disk tier's directory trust (issue 38 item 7): a directory another user owns or others can
write is refused, one agent holds it at a time, and what others could have planted in it (FIFOs,
links, directories, odd names, a file at the next segment's name) is skipped and counted, never
followed, read as a segment, or deleted."""

import os
from pathlib import Path

import pytest

from radixmesh.common.metrics.exposition import render_prometheus
from radixmesh.node_agent.memory.disk.directory import DirectoryInUse
from radixmesh.node_agent.memory.disk.record import DiskBlock, DiskIdentity
from radixmesh.node_agent.memory.disk.segments import SegmentStore
from radixmesh.node_agent.memory.disk.tier import DiskConfig, DiskTier
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.kv_layout import KVLayout

LAYOUT = KVLayout("tiny-test", num_layers=1, num_kv_heads=1, head_dim=2, dtype="float32", block_size=4)
IDENTITY = DiskIdentity.of(LAYOUT, b"cluster-key")
RECORD = IDENTITY.record_bytes
PER_SEGMENT = 4


def blk(i: int) -> DiskBlock:
    return DiskBlock(BlockHash(i.to_bytes(16, "little")), bytes([i]) * LAYOUT.block_bytes, None)


def store(path: Path) -> SegmentStore:
    return SegmentStore(path, IDENTITY, capacity_bytes=4 * PER_SEGMENT * RECORD, segment_bytes=PER_SEGMENT * RECORD)


def segment_names(path: Path) -> list[str]:
    return sorted(p.name for p in path.glob("*.seg"))


def test_a_new_directory_is_made_for_this_user_only(tmp_path: Path) -> None:
    store(tmp_path / "a" / "b").close()
    assert (tmp_path / "a" / "b").stat().st_mode & 0o777 == 0o700


def test_a_directory_others_can_write_is_refused_and_left_untouched(tmp_path: Path) -> None:
    s = store(tmp_path / "d")
    s.append([blk(1)])
    s.close()
    os.chmod(tmp_path / "d", 0o777)
    with pytest.raises(PermissionError, match="may be written by others"):
        store(tmp_path / "d")
    assert segment_names(tmp_path / "d") == ["00000001.seg"]
    os.chmod(tmp_path / "d", 0o755)  # readable by others is not a forgery risk: accepted
    assert len(store(tmp_path / "d")) == 1


def test_a_directory_another_user_owns_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "d").mkdir(mode=0o700)
    me = os.geteuid()
    monkeypatch.setattr(os, "geteuid", lambda: me + 1)  # as seen by another user
    with pytest.raises(PermissionError, match=f"owned by uid {me}, not this user"):
        store(tmp_path / "d")


def test_two_agents_never_share_a_directory(tmp_path: Path) -> None:
    first = store(tmp_path)
    first.append([blk(i) for i in range(6)])
    with pytest.raises(DirectoryInUse, match=f"in use by another agent \\(pid {os.getpid()}\\)"):
        store(tmp_path)
    assert len(first) == 6 and segment_names(tmp_path) == ["00000001.seg", "00000002.seg"]  # nothing deleted
    first.close()
    second = store(tmp_path)  # released by close
    assert len(second) == 6
    second.close()


def test_a_failed_open_releases_the_lock(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="fewer than 2 segments"):
        SegmentStore(tmp_path, IDENTITY, capacity_bytes=RECORD, segment_bytes=RECORD)
    (tmp_path / "00000001.seg").write_bytes(b"x")  # a torn record: the scan reads it and drops it
    store(tmp_path).close()
    store(tmp_path).close()


@pytest.mark.timeout(30)  # a FIFO opened for reading used to block start-up for ever
def test_what_others_planted_is_skipped_counted_and_kept(tmp_path: Path) -> None:
    s = store(tmp_path)
    s.append([blk(i) for i in range(PER_SEGMENT + 1)])  # segments 1 and 2
    s.close()
    real = tmp_path / "00000001.seg"
    os.mkfifo(tmp_path / "00000003.seg")
    (tmp_path / "00000004.seg").symlink_to(real)  # would serve segment 1's blocks twice, and be deleted
    (tmp_path / "00000005.seg").symlink_to(tmp_path / "gone")  # dangling
    (tmp_path / "00000006.seg").mkdir()
    (tmp_path / "¹.seg").write_bytes(b"")  # str.isdigit() is true, int() raised
    (tmp_path / "7.seg").write_bytes(b"")  # not a name this store writes
    (tmp_path / "notes.txt").write_bytes(b"")
    planted = {"00000003.seg", "00000004.seg", "00000005.seg", "00000006.seg", "¹.seg", "7.seg", "notes.txt"}

    tier = DiskTier(DiskConfig(tmp_path, capacity_bytes=4 * PER_SEGMENT * RECORD,
                               segment_bytes=PER_SEGMENT * RECORD), IDENTITY)
    try:
        assert len(tier.store) == PER_SEGMENT + 1 and tier.store.directory.skipped == len(planted)
        assert tier.stats().disk_skipped_files == len(planted)
        assert 'radixmesh_disk_skipped_files{tier="disk"} 7' in render_prometheus([tier.stats()])
        for i in range(10, 10 + PER_SEGMENT):  # a new segment: numbered past every name taken
            tier.offer(blk(i).block_hash, blk(i).payload, parent=None)
        tier.flush()
        assert tier.write_errors == 0
        assert "00000008.seg" in segment_names(tmp_path)  # past 7.seg too
        tier.store.clear()  # a reset deletes our segments only
    finally:
        tier.close()
    left = {p.name for p in tmp_path.iterdir()} - {"lock"}
    assert left == planted and real.exists() is False


def test_a_file_at_the_next_segments_name_does_not_stop_writes(tmp_path: Path) -> None:
    s = store(tmp_path)
    s.append([blk(1)])
    s.close()
    s = store(tmp_path)  # appends go to a fresh segment: 2, unless something else took the name
    (tmp_path / "00000002.seg").write_bytes(b"not ours")
    (tmp_path / "00000003.seg").mkdir()
    s.append([blk(2), blk(3)])  # used to fail with FileExistsError on every append from then on
    assert s.get(blk(3).block_hash) == blk(3).payload
    assert segment_names(tmp_path) == ["00000001.seg", "00000002.seg", "00000003.seg", "00000004.seg"]
    assert (tmp_path / "00000002.seg").read_bytes() == b"not ours"
    s.close()
