"""Filesystem helpers of the store: advisory locks, fsync, hard links, timestamps."""

from __future__ import annotations

import contextlib
import datetime
import errno
import os
import pathlib
import socket
from typing import Callable, Iterator

__all__ = ["flock", "fsync_path", "iso", "try_link"]


@contextlib.contextmanager
def flock(path: pathlib.Path, *, blocking: bool = True, on_wait: Callable[[str], None] | None = None
           ) -> Iterator[bool]:
    """Hold an exclusive ``fcntl.flock`` on ``path`` (created if missing).

    Yields True when the lock is held; with ``blocking=False`` yields False
    instead of waiting. The holder writes ``"<pid> <host>"`` into the file, and
    ``on_wait(holder)`` is called before blocking. The lock file is never
    deleted while held; if another process replaced it (``Cache.clear``), the
    lock is taken again on the new file so two holders can never coexist.
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - non-POSIX: single-process safety only
        yield True
        return
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise
                if not blocking:
                    yield False
                    return
                if on_wait is not None:
                    try:
                        holder = os.pread(fd, 256, 0).decode(errors="replace").strip()
                    except OSError:
                        holder = ""
                    on_wait(holder or "another process")
                fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                same = os.fstat(fd).st_ino == os.stat(path).st_ino
            except FileNotFoundError:
                same = False
            if not same:  # the file was unlinked while we waited: lock the new one
                continue
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
            yield True
            return
        finally:
            os.close(fd)


def fsync_path(path: pathlib.Path, *, directory: bool = False) -> None:
    flags = os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if directory else 0)
    try:
        fd = os.open(path, flags)
    except OSError:  # pragma: no cover - e.g. directories on some platforms
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover - fsync unsupported on this fs
        pass
    finally:
        os.close(fd)


#: What ``os.link`` fails with where the filesystem cannot give ``dst`` the same inode as ``src``:
#: another filesystem, no hard links there (FAT, some FUSE and network mounts), the owner's rule
#: (``fs.protected_hardlinks``), too many links. Anything else (no space, ...) is a real error.
_NO_LINK = {errno.EXDEV, errno.EPERM, errno.EACCES, errno.EMLINK, errno.EOPNOTSUPP, errno.ENOTSUP,
            errno.ENOSYS, errno.EINVAL, errno.ENOENT}


def try_link(src: pathlib.Path, dst: pathlib.Path) -> bool:
    """Hard-link ``dst`` to ``src``; False where this filesystem cannot (then the caller copies).

    Safe for a cache entry's files because the cache never writes into a file it has published:
    an entry is built in a directory of its own and renamed into place; it is removed (evicted,
    cleared, found corrupt) by renaming it away and unlinking, which leaves the data of every
    other link alone; and a rebuilt entry is new files. ``ENOENT``: ``src`` went away meanwhile.
    """
    try:
        os.link(src, dst)
    except OSError as e:
        if e.errno in _NO_LINK:
            return False
        raise
    return True


def iso(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).isoformat(timespec="seconds")
