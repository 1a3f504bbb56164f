"""common/private_files.py: a folder is trusted only when it is this user's and nobody else can write
it; files are created fresh and never written through a link."""

import os
from pathlib import Path

import pytest

from radixmesh.common.private_files import check_private_folder, replace_atomically, write_new


def test_a_private_folder_passes_and_a_missing_one_is_made_0700_only_when_asked(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    check_private_folder(mine)
    missing = tmp_path / "a" / "b"
    check_private_folder(missing)
    assert not missing.exists()
    check_private_folder(missing, create=True)
    assert missing.is_dir() and missing.stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize("mode", [0o777, 0o720, 0o702])
def test_a_folder_group_or_others_can_write_is_refused_untouched(tmp_path: Path, mode: int) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(mode)
    with pytest.raises(PermissionError, match=f"{shared}: group or others can write it \\(mode {mode:o}\\)"):
        check_private_folder(shared, create=True)
    assert shared.stat().st_mode & 0o777 == mode and list(shared.iterdir()) == []


def test_a_link_or_a_file_where_the_folder_goes_is_refused(tmp_path: Path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(private)
    afile = tmp_path / "file"
    afile.write_text("x")
    for path in (link, afile):
        with pytest.raises(PermissionError, match=f"{path}: not a directory"):
            check_private_folder(path)


def test_write_new_creates_with_its_mode_and_never_writes_through_a_link(tmp_path: Path) -> None:
    key = tmp_path / "node.key"
    write_new(key, b"secret", 0o600)
    assert key.read_bytes() == b"secret" and key.stat().st_mode & 0o777 == 0o600
    with pytest.raises(FileExistsError):
        write_new(key, b"other")
    victim = tmp_path / "victim"
    victim.write_bytes(b"untouched")
    planted = tmp_path / "planted"
    planted.symlink_to(victim)
    with pytest.raises(FileExistsError):
        write_new(planted, b"stolen")
    assert victim.read_bytes() == b"untouched"


def test_replace_atomically_replaces_a_link_not_its_target_and_clears_a_planted_aside(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"untouched")
    token = tmp_path / "token"
    token.symlink_to(victim)  # a link where the file goes: replaced itself
    (tmp_path / ".token.tmp").symlink_to(victim)  # a link where the file is written aside: removed first
    replace_atomically(token, b"tok", 0o600)
    assert not token.is_symlink() and token.read_bytes() == b"tok" and token.stat().st_mode & 0o777 == 0o600
    assert victim.read_bytes() == b"untouched"
    assert sorted(os.listdir(tmp_path)) == ["token", "victim"]
    replace_atomically(token, b"new", 0o644)
    assert token.read_bytes() == b"new" and token.stat().st_mode & 0o777 == 0o644
