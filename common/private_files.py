"""Files only this user may replace (keys, tokens, certificates, scrape targets): the folder they live
in, and how they are written into it.

Whoever can write a folder can plant a link where a key goes, or a key they know. So a folder that
is a link, another user's, or one group or others can write is refused, never repaired (we make
ours 0700: someone else made that one, and repairing it would hide that), and a file is created
fresh (O_EXCL), never through a link (O_NOFOLLOW)."""

import os
import stat
from pathlib import Path

_FRESH = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW


def check_private_folder(folder: Path, *, create: bool = False) -> None:
    """Refuse `folder` (PermissionError, naming it and why) unless it is a directory of this user that
    group and others cannot write. A missing one passes, made 0700 (parents too) when `create`."""
    try:
        st = folder.lstat()
    except FileNotFoundError:
        if create:
            folder.mkdir(mode=0o700, parents=True)
        return
    why = ("not a directory (a link or a file)" if not stat.S_ISDIR(st.st_mode)
           else f"owned by another user (uid {st.st_uid})" if st.st_uid != os.geteuid()
           else f"group or others can write it (mode {stat.S_IMODE(st.st_mode):o})" if st.st_mode & 0o022
           else "")
    if why:
        raise PermissionError(f"{folder}: {why}; name a directory of this user that others cannot write")


def write_new(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Create `path` holding `data`, with `mode` from its creation; FileExistsError if anything (a
    link included) is there."""
    fd = os.open(path, _FRESH, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def replace_atomically(path: Path, data: bytes, mode: int = 0o600) -> None:
    """`path` holds `data`: written fresh beside it, then renamed over it, so a reader sees the old
    file or the new one, never a partial one; the rename replaces a link at `path`, not its target.
    A file left beside it (by a crash, or planted) is removed first: a link itself, not its target."""
    aside = path.with_name(f".{path.name}.tmp")
    try:
        write_new(aside, data, mode)
    except FileExistsError:
        os.unlink(aside)
        write_new(aside, data, mode)
    os.replace(aside, path)
