"""The disk tier's directory: trusted only when this user owns it and nobody else can write it, held
by one agent at a time, and read without following what others could have planted in it (issue 38).

Every file operation goes through the directory's own descriptor (`dir_fd`), so a directory swapped
for another (or a link) after the checks changes nothing we touch. Entries that are not a regular
segment file of ours (FIFOs, devices, links, directories, names such as `¹.seg`) are skipped and
counted, never opened for reading in a way that could block, never deleted: a FIFO opened
without O_NONBLOCK hung start-up, and int("¹") crashed it.
"""

import contextlib
import errno
import fcntl
import logging
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)

SUFFIX = ".seg"
LOCK_NAME = "lock"
_SEGMENT_NAME = re.compile(r"[0-9]{8,19}\.seg", re.ASCII)
"""Segment names as `name` writes them: 8 ASCII digits at least, no more than an int64 holds."""
_CREATE_TRIES = 64
"""Names `create` tries past one taken by something else before it gives up (each taken name is
skipped for good: a stray file at the next name used to turn writes off for ever)."""


class DirectoryInUse(RuntimeError):
    """Another agent (this process or another) holds the directory's lock."""


def name(segment: int) -> str:
    return f"{segment:08d}{SUFFIX}"


class SegmentDirectory:
    """One disk tier's directory, opened (created 0700 when missing), checked, and locked until `close`.

    Raises PermissionError when another user owns it or group or others may write it (someone else
    could then plant, swap or delete segments), NotADirectoryError when it is not one, and
    DirectoryInUse when another agent holds it (two agents would evict each other's segments)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.skipped = 0
        """Entries found by `segments` that are not a regular segment file of ours."""
        self._next = 1
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        # The path may be a link the operator made (a cache on a larger disk); what is checked and
        # then used is the directory this descriptor holds, whatever the path names later.
        self.fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self._lock_fd = -1
        try:
            _check_trusted(os.fstat(self.fd), path, "directory")
            self._lock_fd = self._lock()
        except BaseException:
            self.close()
            raise

    def segments(self) -> Iterator[tuple[int, int]]:
        """(segment number, read-only descriptor) of each regular segment file here, oldest first; the
        caller closes each descriptor. Anything else is skipped and counted, and its name is never
        reused by `create`."""
        found: list[int] = []
        for entry in os.scandir(self.fd):
            if entry.name == LOCK_NAME:
                continue
            stem = entry.name.removesuffix(SUFFIX)
            if stem != entry.name and stem.isascii() and stem.isdigit():  # ASCII digits only: never "¹"
                self._next = max(self._next, int(stem) + 1)  # a number taken, ours or not
            if _SEGMENT_NAME.fullmatch(entry.name) and entry.name == name(int(stem)):
                found.append(int(stem))
            else:
                self._skip(entry.name, "not a segment name")
        for segment in sorted(found):
            fd = self._open_regular(name(segment))
            if fd is not None:
                yield segment, fd

    def create(self, after: int) -> tuple[int, int]:
        """(number, read-write append descriptor) of a new segment file numbered above `after` and
        every number seen here; a name something else already took is passed over."""
        self._next = max(self._next, after + 1)
        for _ in range(_CREATE_TRIES):
            segment, self._next = self._next, self._next + 1
            try:
                fd = os.open(name(segment), os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_NOFOLLOW
                             | os.O_CLOEXEC, 0o600, dir_fd=self.fd)
            except FileExistsError:
                log.warning("disk tier: %s in %s is taken by something that is not ours; skipping it",
                            name(segment), self.path)
                continue
            return segment, fd
        raise FileExistsError(errno.EEXIST, f"{_CREATE_TRIES} segment names in a row are taken", str(self.path))

    def unlink(self, segment: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name(segment), dir_fd=self.fd)

    def close(self) -> None:
        """Release the lock and the directory. Idempotent."""
        for fd in (self._lock_fd, self.fd):
            if fd >= 0:
                os.close(fd)  # closing the lock file's only descriptor releases the flock
        self._lock_fd = self.fd = -1

    # --- internals ---------------------------------------------------------------------------
    def _lock(self) -> int:
        # flock, not fcntl locks: fcntl's are per process, so two agents in one process (tests, a
        # restart before the old agent's files are closed) would not exclude each other.
        fd = os.open(LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=self.fd)
        try:
            _check_trusted(os.fstat(fd), self.path / LOCK_NAME, "lock file", regular=True)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                raise DirectoryInUse(f"disk cache directory {self.path} is in use by another agent (pid {holder}); "
                                     f"give each agent a directory of its own") from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _open_regular(self, entry: str) -> int | None:
        """A read-only descriptor of `entry` if it is a regular file of ours, else None (counted)."""
        try:
            # O_NONBLOCK: opening a FIFO must not wait for a writer; O_NOFOLLOW: a link is refused.
            fd = os.open(entry, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=self.fd)
        except OSError as e:
            self._skip(entry, e.strerror or str(e))
            return None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            os.close(fd)
            self._skip(entry, "not a regular file of ours")
            return None
        return fd

    def _skip(self, entry: str, why: str) -> None:
        self.skipped += 1
        log.warning("disk tier: skipping %r in %s: %s", entry, self.path, why)


def _check_trusted(st: os.stat_result, path: Path, what: str, *, regular: bool = False) -> None:
    if regular and not stat.S_ISREG(st.st_mode):
        raise PermissionError(f"disk cache {what} {path} is not a regular file")
    if st.st_uid != os.geteuid():
        raise PermissionError(f"disk cache {what} {path} is owned by uid {st.st_uid}, not this user "
                              f"({os.geteuid()}): use a directory of your own")
    if st.st_mode & 0o022:
        raise PermissionError(f"disk cache {what} {path} may be written by others (mode "
                              f"{stat.S_IMODE(st.st_mode):o}): chmod go-w it, or use a directory of your own")
